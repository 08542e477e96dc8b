"""Split-K paged attention for decode (one query token per request): the Triton kernels (same signature
as paged_decode_attention_torch, plus keyword-only tuning and an optional output buffer).

A long context on few requests would leave most of a GPU idle with one program per (request, KV head),
so the keys of each request are cut into NUM_SPLITS tile-aligned ranges: program (r, kv head, split)
computes a partial softmax for the GROUP query heads of its KV head over its range (the K/V tiles are
read once for the whole group) and stores the normalised partial output and its log-sum-exp; a reduce
program per (r, query head) combines the splits. Both grids depend only on the batch size, the head
counts and NUM_SPLITS (fixed per batch size), never on sequence lengths, so they can be captured in a
CUDA graph; splits past a request's end exit at once and the reduce ignores them.
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

MAX_SPLITS = 32


@triton.jit
def _split_len(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per split: an equal share rounded up to whole tiles (at least one tile)."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N), 1) * BLOCK_N


# the block table's width changes from step to step in eager mode (a recompile per class of its value
# otherwise: == 1, divisible by 16, other); the static CUDA-graph table has one width
@triton.jit(do_not_specialize=["block_table_stride"])
def _decode_split_kernel(
    partial_out_ptr, partial_lse_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    seq_lens_ptr, block_tables_ptr,
    scale_log2e, num_heads,
    query_stride_seq, query_stride_head,
    key_stride_block, key_stride_slot, key_stride_head,
    value_stride_block, value_stride_slot, value_stride_head,
    block_table_stride,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    UPCAST_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    split_len = _split_len(seq_len, NUM_SPLITS, BLOCK_N)
    start = split * split_len
    if start >= seq_len:
        return
    end = tl.minimum(start + split_len, seq_len)

    rows = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + rows
    row_valid = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(query_ptr + seq * query_stride_seq + heads[:, None] * query_stride_head + dims[None, :],
                mask=row_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_G], MASKED_SCORE, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    block_table_row = block_tables_ptr + seq * block_table_stride
    for tile_start in range(start, end, BLOCK_N):
        positions = tile_start + tl.arange(0, BLOCK_N)
        kv_valid = positions < end
        k, v = load_kv_tile(key_cache_ptr, value_cache_ptr, block_table_row, positions, kv_valid, kv_head,
                            key_stride_block, key_stride_slot, key_stride_head,
                            value_stride_block, value_stride_slot, value_stride_head, HEAD_DIM, BLOCK_SIZE)
        visible = row_valid[:, None] & kv_valid[None, :]
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e, UPCAST_DOT, PRECISION)

    # every valid row saw at least one key (start < seq_len), so l_i > 0 there
    safe_l = tl.where(row_valid, l_i, 1.0)
    partial = (seq * num_heads + heads) * NUM_SPLITS + split              # [(R, Hq, NUM_SPLITS)] index
    tl.store(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc / safe_l[:, None],
             mask=row_valid[:, None])
    tl.store(partial_lse_ptr + partial, m_i + tl.log2(safe_l), mask=row_valid)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, partial_out_ptr, partial_lse_ptr, seq_lens_ptr,
    num_heads, out_stride_seq, out_stride_head,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_active = tl.cdiv(seq_len, _split_len(seq_len, NUM_SPLITS, BLOCK_N))
    splits = tl.arange(0, BLOCK_S)
    active = splits < num_active
    dims = tl.arange(0, HEAD_DIM)
    base = (seq * num_heads + head) * NUM_SPLITS
    lse = tl.load(partial_lse_ptr + base + splits, mask=active, other=MASKED_SCORE)
    weights = tl.where(active, tl.exp2(lse - tl.max(lse, axis=0)), 0.0)
    partial = tl.load(partial_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
                      mask=active[:, None], other=0.0)
    total = tl.sum(weights, axis=0)
    # an empty request (seq_len 0, e.g. CUDA-graph padding) yields zeros instead of NaN
    out = tl.sum(weights[:, None] * partial, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + seq * out_stride_seq + head * out_stride_head + dims, out.to(out_ptr.dtype.element_ty))


def default_num_splits(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits enough for about four programs per SM, a power of two in [1, MAX_SPLITS]; a function of
    the batch shape and the device alone, so one captured batch size always gets the same grid."""
    wanted = triton.cdiv(4 * num_sms, max(num_seqs * num_kv_heads, 1))
    return min(MAX_SPLITS, triton.next_power_of_2(wanted))


def _num_sms(device: torch.device) -> int:
    # the interpreter (CPU tensors) has no SMs to fill: one split unless the caller asks for more
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def paged_decode_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: query [R, Hq, D] -> [R, Hq, D] (written into `out` when given)."""
    check_paged_inputs("paged_decode_attention", query, key_cache, value_cache, seq_lens, block_tables)
    num_seqs, num_heads, head_dim = query.shape
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"paged_decode_attention: seq_lens has shape {tuple(seq_lens.shape)}, expected "
                         f"({num_seqs},): one query token per request")
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    elif out.shape != query.shape or out.stride(-1) != 1:
        raise ValueError(f"paged_decode_attention: out must be {tuple(query.shape)} with a contiguous last "
                         "dimension")
    if num_seqs == 0:
        return out
    query = query if query.stride(-1) == 1 else query.contiguous()
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, _num_sms(query.device))
    elif num_splits < 1:
        raise ValueError(f"paged_decode_attention: num_splits must be at least 1, got {num_splits}")
    group = num_heads // num_kv_heads
    tiles = tile_config(query.dtype, head_dim)
    partial_out = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32,
                              device=query.device)
    partial_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        partial_out, partial_lse, query, key_cache, value_cache, seq_lens, block_tables,
        scale * LOG2E, num_heads,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=tiles.block_n, NUM_SPLITS=num_splits,
        **dot_settings(_decode_split_kernel, query.dtype), num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    _decode_reduce_kernel[(num_seqs, num_heads)](
        out, partial_out, partial_lse, seq_lens, num_heads, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_N=tiles.block_n, NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
    )
    return out
