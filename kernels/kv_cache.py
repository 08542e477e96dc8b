"""Writing new keys and values into the paged KV cache: the torch reference (the CPU path).

Layout of one layer's cache: key_cache and value_cache, each [num_blocks, block_size, num_kv_heads,
head_dim]. Token t goes to slot slot_mapping[t] = block_id * block_size + offset; a negative slot (padding)
is skipped.
"""

from __future__ import annotations

import torch


def write_kv_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key, value [T, Hk, D] -> key_cache/value_cache at slot_mapping [T] (int64), in place."""
    num_blocks, block_size, heads, dim = key_cache.shape
    flat_k = key_cache.view(num_blocks * block_size, heads, dim)
    flat_v = value_cache.view(num_blocks * block_size, heads, dim)
    slots = slot_mapping.long()
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    flat_k.index_copy_(0, slots, key.to(key_cache.dtype))
    flat_v.index_copy_(0, slots, value.to(value_cache.dtype))
