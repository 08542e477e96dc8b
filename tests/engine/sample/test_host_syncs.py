"""Review F4, the CPU-visible part of removing host syncs: the sync-free weight path the sampler takes on a
GPU gives exactly the weights of the CPU path (which reads the minimum first to skip passes), and the
step's small host arrays reach the CPU device without a copy. That the GPU path makes no sync needs a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.sampler import exp_weights
from engine.sample.transfer import to_device


@pytest.mark.parametrize("low", [0.5, -3.0, -200.0])      # none below the floor; some; some below exp's range
def test_sync_free_weights_equal_the_cpu_path(low):
    gen = torch.Generator().manual_seed(1)
    log_weights = torch.rand(6, 1000, generator=gen) * 30 + low
    log_weights[0, :5] = torch.tensor([0.0, -1e-7, 1e-7, -87.5, 70.0])
    skipped = exp_weights(log_weights.clone(), skip_unneeded_passes=True)
    always = exp_weights(log_weights.clone(), skip_unneeded_passes=False)
    assert torch.equal(skipped, always)
    assert bool(((always == 0) | (always >= 1)).all())               # every weight dropped or kept at >= 1
    assert torch.equal(always == 0, log_weights < 0)


def test_host_arrays_reach_the_cpu_device_without_a_copy():
    array = np.arange(5, dtype=np.int64)
    tensor = to_device(array, torch.device("cpu"))
    assert tensor.data_ptr() == array.ctypes.data and tensor.tolist() == [0, 1, 2, 3, 4]
    strided = np.arange(10, dtype=np.int64)[::2]
    assert to_device(strided, torch.device("cpu")).tolist() == [0, 2, 4, 6, 8]
