"""Paged attention over a flattened mixed batch: the Triton kernel (same signature as paged_attention_torch).

Tiling. A program owns one KV head and BLOCK_Q consecutive query tokens of one request, for all GROUP
query heads that share that KV head: its BLOCK_M = BLOCK_Q * GROUP rows are (token, head) pairs, so each
K/V tile is loaded once per group (GQA) and tl.dot sees at least 16 rows even for decode tokens. It walks
the request's keys in tiles of BLOCK_N through the block table, with an online softmax in fp32, up to
the last key its last query token may see (causal; a prefix-cache hit is simply a longer context).

Grid. Request r's tiles are numbered from query_start_loc[r] // BLOCK_Q + r, so num_tokens // BLOCK_Q +
num_seqs programs per KV head always suffice; each finds its request by binary search over
query_start_loc and exits if it is past the request's queries. The grid thus comes from shapes alone:
no max_query_len, no device sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_attention_tiles import (
    LOG2E,
    MASKED_SCORE,
    attend_tile,
    check_paged_inputs,
    dot_settings,
    load_kv_tile,
    tile_config,
)


# the batch size and the block table's width change from step to step; Triton would otherwise compile a
# variant for each of their values' classes (== 1, divisible by 16, other) in the middle of serving
@triton.jit(do_not_specialize=["num_seqs", "block_table_stride"])
def _paged_attention_kernel(
    out_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale_log2e, num_seqs,
    query_stride_token, query_stride_head, out_stride_token, out_stride_head,
    key_stride_block, key_stride_slot, key_stride_head,
    value_stride_block, value_stride_slot, value_stride_head,
    block_table_stride,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)

    # the request owning this tile: the last r whose first tile number is <= tile
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1

    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    local_tile = tile - (query_start // BLOCK_Q + seq)
    if local_tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    query_pos = local_tile * BLOCK_Q + rows // GROUP          # index within this request's queries
    heads = kv_head * GROUP + rows % GROUP
    row_valid = (rows // GROUP < BLOCK_Q) & (query_pos < query_len)
    dims = tl.arange(0, HEAD_DIM)
    tokens = (query_start + query_pos).to(tl.int64)
    q = tl.load(query_ptr + tokens[:, None] * query_stride_token + heads[:, None] * query_stride_head
                + dims[None, :], mask=row_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], MASKED_SCORE, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # keys up to the one seen by the tile's last query token
    kv_end = context_len + tl.minimum((local_tile + 1) * BLOCK_Q, query_len)
    key_limit = context_len + query_pos                        # last key each row may see
    block_table_row = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for start in range(0, kv_end, BLOCK_N):
        positions = start + tl.arange(0, BLOCK_N)
        kv_valid = positions < kv_end
        k, v = load_kv_tile(key_cache_ptr, value_cache_ptr, block_table_row, positions, kv_valid, kv_head,
                            key_stride_block, key_stride_slot, key_stride_head,
                            value_stride_block, value_stride_slot, value_stride_head, HEAD_DIM, BLOCK_SIZE)
        visible = kv_valid[None, :] & (positions[None, :] <= key_limit[:, None])
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e, UPCAST_DOT, PRECISION)

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tokens[:, None] * out_stride_token + heads[:, None] * out_stride_head + dims[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def query_tile_rows(num_tokens: int, num_seqs: int, group: int, max_rows: int) -> int:
    """BLOCK_M from shapes only: about the mean query length times the group, between 16 and max_rows
    (a batch of mostly decode tokens gets small tiles, long prefills large ones), and never fewer than
    the group so every tile holds at least one query token."""
    mean_rows = -(-num_tokens // max(num_seqs, 1)) * group
    return max(16, min(max_rows, triton.next_power_of_2(mean_rows)), triton.next_power_of_2(group))


def paged_attention_triton(
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
    check_paged_inputs("paged_attention", query, key_cache, value_cache, seq_lens, block_tables)
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"paged_attention: query_start_loc has shape {tuple(query_start_loc.shape)}, "
                         f"expected ({num_seqs + 1},) for {num_seqs} requests")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    elif out.shape != query.shape or out.stride(-1) != 1:
        raise ValueError(f"paged_attention: out must be {tuple(query.shape)} with a contiguous last dimension")
    num_tokens, num_heads, head_dim = query.shape
    if num_tokens == 0 or num_seqs == 0:
        return out
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    tiles = tile_config(query.dtype, head_dim)
    block_m = query_tile_rows(num_tokens, num_seqs, group, tiles.max_rows)
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
        scale * LOG2E, num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=tiles.block_n,
        **dot_settings(_paged_attention_kernel, query.dtype), num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
