"""Rotary position embedding, neox style: the Triton kernel (same signature as rotary_embedding_torch).

One program per token rotates all its query and key heads with one read of the token's cos/sin row
(the table from rope_cos_sin_cache, llama3 scaling included). query and key may be strided views (the
split of a fused qkv projection); the results are new contiguous tensors. Each product is rounded to the
input dtype as the reference's torch ops round it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(out_ptr, x_ptr, x_stride_token, x_stride_head, token, cos, sin, num_heads,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < num_heads)[:, None] & (cols < HALF)[None, :]
    src = x_ptr + token * x_stride_token + heads[:, None] * x_stride_head + cols[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    x1_cos = (x1 * cos[None, :]).to(dtype).to(tl.float32)
    x2_sin = (x2 * sin[None, :]).to(dtype).to(tl.float32)
    x2_cos = (x2 * cos[None, :]).to(dtype).to(tl.float32)
    x1_sin = (x1 * sin[None, :]).to(dtype).to(tl.float32)
    dst = out_ptr + token * num_heads * (2 * HALF) + heads[:, None] * (2 * HALF) + cols[None, :]
    tl.store(dst, (x1_cos - x2_sin).to(dtype), mask=mask)
    tl.store(dst + HALF, (x2_cos + x1_sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    query_out_ptr, key_out_ptr, query_ptr, key_ptr, positions_ptr, cos_sin_ptr,
    query_stride_token, query_stride_head, key_stride_token, key_stride_head, cos_sin_stride,
    num_heads, num_kv_heads,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)
    row = cos_sin_ptr + position * cos_sin_stride + cols
    cos = tl.load(row, mask=cols < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF, mask=cols < HALF, other=0.0).to(tl.float32)
    # the reference casts the table to the activations' dtype before multiplying
    cos = cos.to(query_out_ptr.dtype.element_ty).to(tl.float32)
    sin = sin.to(query_out_ptr.dtype.element_ty).to(tl.float32)
    _rotate_heads(query_out_ptr, query_ptr, query_stride_token, query_stride_head, token, cos, sin,
                  num_heads, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(key_out_ptr, key_ptr, key_stride_token, key_stride_head, token, cos, sin,
                  num_kv_heads, HALF, BLOCK_HK, BLOCK_HALF)


def rotary_embedding_triton(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, Hq, D], key [T, Hk, D], positions [T] -> rotated (query, key), new tensors."""
    if query.dim() != 3 or key.dim() != 3:
        raise ValueError(f"rotary_embedding: query and key must be [T, H, D], got {tuple(query.shape)} "
                         f"and {tuple(key.shape)}")
    if query.dtype != key.dtype:
        raise ValueError(f"rotary_embedding: query is {query.dtype} but key is {key.dtype}")
    num_tokens, num_heads, head_dim = query.shape
    if key.shape[0] != num_tokens or key.shape[2] != head_dim or positions.shape != (num_tokens,):
        raise ValueError(f"rotary_embedding: shapes disagree: positions {tuple(positions.shape)}, "
                         f"query {tuple(query.shape)}, key {tuple(key.shape)}")
    if head_dim % 2 or cos_sin_cache.shape[-1] != head_dim:
        raise ValueError(f"rotary_embedding: table width {cos_sin_cache.shape[-1]} does not fit head_dim {head_dim}")
    query_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    key_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    if num_tokens == 0:
        return query_out, key_out
    query = query if query.stride(-1) == 1 else query.contiguous()
    key = key if key.stride(-1) == 1 else key.contiguous()
    cos_sin_cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        query_out, key_out, query, key, positions, cos_sin_cache,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos_sin_cache.stride(0),
        num_heads, key.shape[1],
        HALF=half, BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(key.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half), num_warps=4,
    )
    return query_out, key_out
