"""silu_and_mul_triton against silu_and_mul_torch (under Triton's interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.activation import silu_and_mul_torch
from kernels.triton_activation import silu_and_mul_triton
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2 * 48), (2, 2, 2 * 1100)])  # 1100 spans two column blocks of 1024
def test_silu_and_mul_matches_reference(dtype, shape):
    x = (3 * torch.randn(*shape, generator=torch.Generator().manual_seed(3))).to(dtype)
    out = silu_and_mul_triton(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    assert_close(out, silu_and_mul_torch(x))


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="not even"):
        silu_and_mul_triton(torch.randn(2, 7))
