"""Per-dtype tolerances for comparing a Triton kernel with its torch reference.

bf16 is loose for two reasons: one bf16 rounding step is 2**-8 relative, and Triton's interpreter
truncates when it casts fp32 to bf16 where the GPU (and torch) round to nearest, so results under the
interpreter can sit one step off the reference even where the kernel reproduces its rounding exactly.
"""

from __future__ import annotations

import torch

TOLERANCES = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same dtype and shape, values within the dtype's tolerance."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, **TOLERANCES[expected.dtype])
