"""GGUF-quantized weights on CUDA: a Triton GEMM that dequantizes its weight tile in registers (W4A16 for
4-bit types, W8A16 for the others), beside kernels/gguf_blocks.quant_matmul_torch as its reference.

At load each part of a QuantizedWeight is unpacked once (gguf_blocks.unpack) into a GPU form: codes packed
two to a byte for Q4_0/Q4_1/Q4_K (a byte holds the codes of values 2j, 2j + 1) or one a byte for Q5_*, Q6_K
and Q8_0, plus a scale and an offset per group of 16 or 32 values (fp16 for the legacy types, where they are
exact: fp16 scales times small powers of two; fp32 for the k-quants, whose scales are products). The kernel
loads x [BLOCK_M, BLOCK_K] in its 16-bit dtype and the codes [BLOCK_K, BLOCK_N], forms scale * code + offset
in fp32, rounds it to x's dtype (what a 16-bit GEMM of the dequantized weight multiplies) and accumulates
`tl.dot` in fp32: a decode step reads the 4- or 8-bit codes instead of 16-bit weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gguf_blocks import FOUR_BIT, QUANT_TYPES, QuantizedWeight, bytes_by_type, unpack
from kernels.triton_attention_tiles import dot_settings


@triton.jit
def _quant_matmul_kernel(
    x_ptr, codes_ptr, scale_ptr, offset_ptr, out_ptr, M, N, K,
    stride_xm, stride_cn, stride_sn, stride_om,
    GROUP: tl.constexpr, PACKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, UPCAST_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        if PACKED:
            offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            packed = tl.load(codes_ptr + offs_n[None, :] * stride_cn + offs_b[:, None], mask=mask_n[None, :], other=0)
            pairs = tl.join(packed & 15, packed >> 4)                         # [BLOCK_K // 2, BLOCK_N, 2]
            codes = tl.reshape(tl.permute(pairs, (0, 2, 1)), (BLOCK_K, BLOCK_N))
        else:
            codes = tl.load(codes_ptr + offs_n[None, :] * stride_cn + offs_k[:, None], mask=mask_n[None, :], other=0)
        offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        scale = tl.load(scale_ptr + offs_n[None, :] * stride_sn + offs_g[:, None], mask=mask_n[None, :], other=0.0)
        offset = tl.load(offset_ptr + offs_n[None, :] * stride_sn + offs_g[:, None], mask=mask_n[None, :], other=0.0)
        grouped = tl.reshape(codes.to(tl.float32), (BLOCK_K // GROUP, GROUP, BLOCK_N))
        weight = grouped * scale.to(tl.float32)[:, None, :] + offset.to(tl.float32)[:, None, :]
        weight = tl.reshape(weight, (BLOCK_K, BLOCK_N)).to(x_ptr.dtype.element_ty)
        if UPCAST_DOT:          # Triton's interpreter: see triton_attention_tiles.dot_settings
            acc = tl.dot(x.to(tl.float32), weight.to(tl.float32), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(x, weight, acc, input_precision=PRECISION)
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


class _Part:
    """One part's GPU form: codes (packed or not), scale and offset per group."""

    def __init__(self, type_id: int, raw: torch.Tensor, k: int, device: torch.device):
        codes, scale, offset, self.group = unpack(raw.cpu(), type_id, k)
        self.type_id, self.rows, self.packed = type_id, raw.shape[0], type_id in FOUR_BIT
        if self.packed:
            codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
        dtype = torch.float16 if QUANT_TYPES[type_id][1] == 32 else torch.float32
        self.codes = codes.contiguous().to(device)
        self.scale = scale.to(dtype).contiguous().to(device)
        self.offset = offset.to(dtype).contiguous().to(device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.offset))


class TritonQuantWeight:
    """A QuantizedWeight in its GPU form on `device`; .matmul(x) runs the Triton kernel per part into its
    columns of one output, .rows(ids) dequantizes rows (a token embedding) in torch."""

    def __init__(self, weight: QuantizedWeight, device: torch.device):
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.parts = [_Part(type_id, raw, weight.in_features, device) for type_id, raw in weight.parts]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def bytes_by_type(self) -> dict[str, int]:
        return bytes_by_type((part.type_id, part.nbytes) for part in self.parts)

    def matmul(self, x: torch.Tensor, precise: bool = False) -> torch.Tensor:
        """x's own 16-bit activations: `precise` (the CPU kernels' two 8-bit planes) has nothing to add."""
        return quant_matmul_triton(x, self)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of a one-part weight (a token embedding), dequantized in torch: float32 [n, K]."""
        part = self.parts[0]
        codes = part.codes[ids]
        if part.packed:
            codes = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(len(ids), self.in_features)
        groups = codes.float().reshape(len(ids), -1, part.group)
        return (groups * part.scale[ids].float()[:, :, None] + part.offset[ids].float()[:, :, None]).reshape(
            len(ids), self.in_features)


def _blocks_for(m: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps): narrow tiles for decode-sized inputs (bound by reading the
    weights: many programs over N), square ones for prefill; BLOCK_K divides K (a multiple of 32)."""
    block_k = next(b for b in (128, 64, 32) if k % b == 0)
    if m <= 16:
        return 16, 32, block_k, 4
    if m <= 64:
        return 64, 64, block_k, 4
    return 128, 128, min(block_k, 64), 8


def quant_matmul_triton(x: torch.Tensor, weight: TritonQuantWeight) -> torch.Tensor:
    """x [M, K] (fp16/bf16/fp32 on CUDA) @ weightᵀ -> [M, N] in x's dtype."""
    if x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"quant_matmul: x {tuple(x.shape)} against a weight of {weight.in_features} inputs")
    x = x if x.stride(1) == 1 else x.contiguous()
    m, k = x.shape
    out = torch.empty(m, weight.out_features, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_m, block_n, block_k, warps = _blocks_for(m, k)
    col = 0
    for part in weight.parts:
        view = out[:, col:col + part.rows]
        grid = (triton.cdiv(m, block_m), triton.cdiv(part.rows, block_n))
        _quant_matmul_kernel[grid](
            x, part.codes, part.scale, part.offset, view, m, part.rows, k,
            x.stride(0), part.codes.stride(0), part.scale.stride(0), out.stride(0),
            GROUP=part.group, PACKED=part.packed, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, **dot_settings(_quant_matmul_kernel, x.dtype),
        )
        col += part.rows
    return out
