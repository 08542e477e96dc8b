"""RMSNorm with an optional fused residual add: the Triton kernel (same signature as rms_norm_torch).

One program normalises one row. The rounding steps of the reference (the residual sum in the input dtype,
the normalised value cast back before the weight multiplies it) are reproduced, so 16-bit results differ
from Hugging Face's by at most a rounding step rather than by accumulated double roundings.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    out_ptr, residual_out_ptr, x_ptr, residual_ptr, weight_ptr,
    x_stride, residual_stride, hidden_size, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * hidden_size + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden_size
    normed = x * tl.rsqrt(variance + eps)
    if HAS_RESIDUAL:
        normed = normed.to(residual_out_ptr.dtype.element_ty).to(tl.float32)
    else:
        normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden_size + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """y = weight * x / rms(x); with `residual`, (y, x + residual) as rms_norm_torch returns. New tensors."""
    hidden_size = x.shape[-1]
    if tuple(weight.shape) != (hidden_size,):
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {hidden_size}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} differs from x {tuple(x.shape)}")
    norm_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, norm_dtype), device=x.device)
    residual_out = None if residual is None else torch.empty(x.shape, dtype=norm_dtype, device=x.device)
    rows = x.reshape(-1, hidden_size)
    if rows.shape[0] == 0:
        return out if residual is None else (out, residual_out)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    residual_rows = rows if residual is None else residual.reshape(-1, hidden_size)
    residual_rows = residual_rows if residual_rows.stride(-1) == 1 else residual_rows.contiguous()
    block = triton.next_power_of_2(hidden_size)
    _rms_norm_kernel[(rows.shape[0],)](
        out, out if residual_out is None else residual_out, rows, residual_rows, weight,
        rows.stride(0), residual_rows.stride(0), hidden_size, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 512)),
    )
    return out if residual is None else (out, residual_out)
