"""rms_norm_triton against rms_norm_torch (under Triton's interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.rms_norm import rms_norm_torch
from kernels.triton_rms_norm import rms_norm_triton
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 96), (2, 3, 64)])   # 96: a row that does not fill its power-of-two block
def test_rms_norm_matches_reference(dtype, shape):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=gen).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype)
    assert_close(rms_norm_triton(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual_add_returns_normed_sum_and_sum(dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(7, 80, generator=gen).to(dtype)
    residual = torch.randn(7, 80, generator=gen).to(dtype)
    weight = torch.randn(80, generator=gen).to(dtype)
    out, new_residual = rms_norm_triton(x, weight, 1e-5, residual)
    ref_out, ref_residual = rms_norm_torch(x, weight, 1e-5, residual)
    assert_close(out, ref_out)
    assert_close(new_residual, ref_residual)


def test_output_dtype_follows_reference_promotion():
    x = torch.randn(3, 64).to(torch.bfloat16)
    weight = torch.randn(64)                                  # fp32 weight on bf16 activations
    out = rms_norm_triton(x, weight, 1e-6)
    ref = rms_norm_torch(x, weight, 1e-6)
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_strided_rows_are_read_in_place():
    wide = torch.randn(4, 128)
    x = wide[:, :64]                                          # rows with stride 128
    weight = torch.randn(64)
    assert_close(rms_norm_triton(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6))


def test_mismatched_weight_is_rejected():
    with pytest.raises(ValueError, match="weight shape"):
        rms_norm_triton(torch.randn(2, 64), torch.randn(32), 1e-6)
