"""SiLU-and-mul (the SwiGLU gate): the Triton kernel (same signature as silu_and_mul_torch).

Grid: (rows, column blocks). silu(gate) is rounded to the input dtype before the product, as the
reference's two torch ops do, so 16-bit results agree with it to a rounding step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, x_stride, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * d + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] along the last dimension -> silu(gate) * up, a new tensor [..., d]."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dimension {x.shape[-1]} is not even ([gate | up])")
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, 2 * d)
    if rows.shape[0] == 0 or d == 0:
        return out
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    block = min(_BLOCK, triton.next_power_of_2(d))
    _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
        out, rows, rows.stride(0), d, BLOCK=block, num_warps=4
    )
    return out
