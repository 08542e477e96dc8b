"""Review F6: the startup warm-up shapes reach every attention-kernel variant (mixed BLOCK_M, decode
NUM_SPLITS) that any eager step could select, so no step compiles mid-serving. Checked on shapes alone: the
variant functions are the kernels' own, and every (tokens, sequences) batch within the limits is tried."""

from __future__ import annotations

import pytest

from engine.executor.kernel_warmup import warmup_shapes
from kernels.triton_decode_attention import default_num_splits
from kernels.triton_paged_attention import query_tile_rows


def _variant(num_tokens: int, num_seqs: int, group: int, max_rows: int, kv_heads: int, sms: int):
    if num_tokens == num_seqs:                                  # every request has one token: decode kernel
        return ("decode", default_num_splits(num_seqs, kv_heads, sms))
    return ("mixed", query_tile_rows(num_tokens, num_seqs, group, max_rows))


@pytest.mark.parametrize("group,max_rows,kv_heads,sms,max_num_seqs", [
    (1, 64, 16, 132, 256),      # Llama-2-7B-like, bf16
    (2, 64, 8, 132, 128),       # Qwen3-0.6B
    (4, 64, 8, 132, 256),       # Llama-3.1-8B
    (7, 64, 4, 132, 64),        # Qwen2.5-7B: group not a power of two
    (4, 32, 2, 78, 48),         # fp32 tiles on a smaller GPU
    (32, 64, 1, 132, 16),       # a group wider than the smallest tile
])
def test_warmup_reaches_every_variant_a_step_can_select(group, max_rows, kv_heads, sms, max_num_seqs):
    tokens = 512
    shapes = warmup_shapes(group=group, max_rows=max_rows, num_kv_heads=kv_heads, num_sms=sms,
                           max_num_seqs=max_num_seqs, max_num_batched_tokens=tokens)
    warmed = {_variant(t, r, group, max_rows, kv_heads, sms) for t, r in shapes}
    reachable = {_variant(t, r, group, max_rows, kv_heads, sms)
                 for r in range(1, max_num_seqs + 1) for t in range(r, tokens + 1)}
    assert warmed == reachable
    assert len(shapes) == len(warmed)                           # one forward per variant, no more
    assert all(r <= t <= tokens and r <= max_num_seqs for t, r in shapes)
