"""Pieces shared by the two paged attention kernels: gathering a K/V tile through the block table, one
online-softmax step, and the checks, tile sizes and dot settings their launchers share.

Scores are kept in base 2 (the softmax scale is pre-multiplied by log2(e)) so the kernels use exp2.
Masked scores get a large finite negative value rather than -inf, and masked probabilities are zeroed
explicitly, so a row that sees no key in a tile never produces NaN.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

LOG2E = math.log2(math.e)
MASKED_SCORE = tl.constexpr(-1.0e30)
# powers of two (tl.arange) of at least 16 (tl.dot's smallest K); 16 is the demo and tiny test models' size
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)


@triton.jit
def load_kv_tile(key_cache_ptr, value_cache_ptr, block_table_row, positions, valid, kv_head,
                 key_stride_block, key_stride_slot, key_stride_head,
                 value_stride_block, value_stride_slot, value_stride_head,
                 HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Keys (transposed, [HEAD_DIM, N]) and values ([N, HEAD_DIM]) of one KV head at the given positions of
    one request, found through its block table; invalid positions read as zeros."""
    blocks = tl.load(block_table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    offsets = positions % BLOCK_SIZE
    dims = tl.arange(0, HEAD_DIM)
    k = tl.load(key_cache_ptr + blocks[None, :] * key_stride_block + offsets[None, :] * key_stride_slot
                + kv_head * key_stride_head + dims[:, None], mask=valid[None, :], other=0.0)
    v = tl.load(value_cache_ptr + blocks[:, None] * value_stride_block + offsets[:, None] * value_stride_slot
                + kv_head * value_stride_head + dims[None, :], mask=valid[:, None], other=0.0)
    return k, v


@triton.jit
def attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2e,
                UPCAST_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One online-softmax step: q [M, D], k [D, N], v [N, D], visible [M, N] -> new (m_i, l_i, acc)."""
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    if UPCAST_DOT:
        scores = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision=PRECISION)
    else:
        scores = tl.dot(q, k, input_precision=PRECISION)
    scores = tl.where(visible, scores * scale_log2e, MASKED_SCORE)
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.where(visible, tl.exp2(scores - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    # probabilities are rounded to the activations' dtype for the second matmul, as flash attention does
    p = p.to(v.dtype)
    if UPCAST_DOT:
        acc = tl.dot(p.to(tl.float32), v.to(tl.float32), acc * alpha[:, None], input_precision=PRECISION)
    else:
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


def dot_settings(kernel, dtype: torch.dtype) -> dict:
    """Constexprs for attend_tile. fp32 is the correctness mode, so its dots use three tf32 passes (about
    fp32 accuracy; plain fp32 "ieee" dots spill registers on sm_90) instead of one. Triton's interpreter
    multiplies bfloat16 bit patterns in tl.dot (triton issue #11584), so under it the operands are widened
    to fp32 first; compiled kernels never take that branch."""
    return {
        "UPCAST_DOT": not isinstance(kernel, JITFunction),
        "PRECISION": "tf32x3" if dtype == torch.float32 else "tf32",
    }


def check_paged_inputs(
    name: str,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
) -> None:
    """Raise ValueError naming the problem when the shapes of a paged attention call disagree."""
    if query.dim() != 3:
        raise ValueError(f"{name}: query must be [tokens, heads, head_dim], got {tuple(query.shape)}")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"{name}: caches must both be [num_blocks, block_size, kv_heads, head_dim], got "
                         f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim:
        raise ValueError(f"{name}: query head_dim {head_dim} differs from the cache's {key_cache.shape[3]}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name}: head_dim {head_dim} is not supported "
                         f"({', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    if num_heads % num_kv_heads:
        raise ValueError(f"{name}: {num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if block_tables.dim() != 2 or block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"{name}: block_tables {tuple(block_tables.shape)} must have one row per request "
                         f"({seq_lens.shape[0]} in seq_lens)")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1 or block_tables.stride(-1) != 1:
        raise ValueError(f"{name}: the caches' and block_tables' last dimension must be contiguous")


class TileConfig(NamedTuple):
    block_n: int        # keys per inner-loop step
    max_rows: int       # cap on the mixed kernel's BLOCK_M
    num_warps: int
    num_stages: int     # software pipelining depth of the K/V loads


def tile_config(dtype: torch.dtype, head_dim: int) -> TileConfig:
    """Tile sizes under which no variant spills registers on sm_90 with triton 3.6 or 3.9 (see
    python -m tools.kernel_resources): 16-bit heads up to 128 take 64-key tiles on 4 warps; fp32 and
    wider heads need smaller tiles. Not yet tuned by measurement on a GPU."""
    if dtype == torch.float32:
        return TileConfig(block_n=32, max_rows=32, num_warps=8, num_stages=2)
    if head_dim > 128:
        return TileConfig(block_n=32, max_rows=64, num_warps=8, num_stages=2)
    return TileConfig(block_n=64, max_rows=64, num_warps=4, num_stages=3)
