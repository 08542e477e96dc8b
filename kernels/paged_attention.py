"""Paged attention over a flattened batch of variable-length queries: the torch reference (the CPU path).

Request r owns query tokens query_start_loc[r] : query_start_loc[r + 1] (q_len of them), which are the last
q_len of its seq_lens[r] tokens; its keys and values (the new ones already written) live in the paged cache
at the blocks block_tables[r]. Attention is causal: the query at position p sees keys 0..p. Grouped-query
attention: query head h reads KV head h // (Hq // Hk). Decode requests (q_len == 1) are gathered and computed
as one batched call; prefill chunks (with prefix-cache hits: the cached part is only read) one call each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def paged_attention_torch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [T, Hq, D]; caches [num_blocks, block_size, Hk, D]; query_start_loc [R + 1] int32;
    seq_lens [R] int32; block_tables [R, max_blocks] int32 -> out [T, Hq, D]."""
    if out is None:
        out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decodes = [r for r in range(len(lens)) if starts[r + 1] - starts[r] == 1]
    if decodes:
        rows = torch.tensor([starts[r] for r in decodes], dtype=torch.long, device=query.device)
        index = torch.tensor(decodes, dtype=torch.long, device=query.device)
        out[rows] = paged_decode_attention_torch(
            query[rows], key_cache, value_cache, seq_lens[index], block_tables[index], scale
        )
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    for r in range(len(lens)):
        start, end = starts[r], starts[r + 1]
        q_len, seq_len = end - start, lens[r]
        if q_len <= 1:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_tables[r, :num_blocks].long()
        k = key_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)     # [Hk, S, D]
        v = value_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1)
        # the group's query heads become rows of queries of their KV head: [Hk, group * q_len, D]
        q = query[start:end].transpose(0, 1).reshape(num_kv_heads, group * q_len, -1)
        key_pos = torch.arange(seq_len, device=query.device)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        mask = (key_pos[None, :] <= query_pos[:, None]).repeat(group, 1)  # [group * q_len, S]
        o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale)
        out[start:end] = o.reshape(-1, q_len, o.shape[-1]).transpose(0, 1)
    return out


def paged_decode_attention_torch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request: query [R, Hq, D] -> [R, Hq, D], every request in one batched call.

    The Hq // Hk query heads that share a KV head are laid out as that head's rows of queries, so SDPA sees
    plain multi-query attention per KV head with no repeat of K and V (2.7x faster on CPU than
    enable_gqa at 64 requests of ~500 tokens, and bitwise the same math)."""
    num_reqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = int(seq_lens.max())
    num_blocks = -(-max_len // block_size)
    blocks = block_tables[:, :num_blocks].long()                           # [R, nb]
    k = key_cache[blocks].flatten(1, 2).transpose(1, 2)                    # [R, Hk, nb*bs, D]
    v = value_cache[blocks].flatten(1, 2).transpose(1, 2)
    positions = torch.arange(k.shape[2], device=query.device)
    mask = (positions[None, :] < seq_lens[:, None].to(positions.dtype))[:, None, None, :]
    o = F.scaled_dot_product_attention(
        query.reshape(num_reqs, num_kv_heads, group, head_dim), k.to(query.dtype), v.to(query.dtype),
        attn_mask=mask, scale=scale,
    )
    return o.reshape(num_reqs, num_heads, head_dim)
