"""Writing new keys and values into the paged KV cache: the Triton kernel (same signature as
write_kv_cache_torch).

One program per token copies its [Hk, D] key and value rows to slot slot_mapping[t]; a negative slot
(padding) returns at once, so the grid depends only on the number of tokens (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_cache_kernel(
    key_cache_ptr, value_cache_ptr, key_ptr, value_ptr, slot_mapping_ptr,
    key_stride_token, key_stride_head, value_stride_token, value_stride_head,
    key_cache_stride_block, key_cache_stride_slot, key_cache_stride_head,
    value_cache_stride_block, value_cache_stride_slot, value_cache_stride_head,
    num_kv_heads,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (cols < HEAD_DIM)
    key = tl.load(key_ptr + token * key_stride_token + heads * key_stride_head + cols, mask=mask)
    value = tl.load(value_ptr + token * value_stride_token + heads * value_stride_head + cols, mask=mask)
    key_dst = key_cache_ptr + block * key_cache_stride_block + offset * key_cache_stride_slot
    value_dst = value_cache_ptr + block * value_cache_stride_block + offset * value_cache_stride_slot
    tl.store(key_dst + heads * key_cache_stride_head + cols, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_dst + heads * value_cache_stride_head + cols, value.to(value_cache_ptr.dtype.element_ty),
             mask=mask)


def write_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key, value [T, Hk, D] -> key_cache/value_cache [num_blocks, block_size, Hk, D] at slot_mapping [T]."""
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"write_kv_cache: caches must both be [num_blocks, block_size, Hk, D], got "
                         f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    num_tokens = slot_mapping.shape[0]
    expected = (num_tokens, num_kv_heads, head_dim)
    if tuple(key.shape) != expected or tuple(value.shape) != expected:
        raise ValueError(f"write_kv_cache: key {tuple(key.shape)} and value {tuple(value.shape)} must be "
                         f"{expected} (slot_mapping has {num_tokens} entries)")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("write_kv_cache: the caches' last dimension must be contiguous (they are written in place)")
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    _write_kv_cache_kernel[(num_tokens,)](
        key_cache, value_cache, key, value, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        num_kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim), num_warps=4,
    )
