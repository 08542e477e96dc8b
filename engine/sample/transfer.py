"""Host-to-device copies of a step's small numpy arrays without a host sync (review F4).

`torch.from_numpy(a).to("cuda")` copies from pageable memory, which makes the host wait for the copy, and
the copy waits for everything queued before it: the whole forward pass, when it is issued just after the
graph replay. Staged through pinned memory, the copy is asynchronous; the caching host allocator keeps the
pinned block alive until the copy has completed, so the temporary may be dropped at once. On the CPU the
array is wrapped, not copied.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` as a tensor on `device`, copied asynchronously when that is a GPU."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
