"""paged_attention_triton (the mixed-batch kernel) against paged_attention_torch, under Triton's
interpreter on the CPU: batch mixes, lengths crossing block and tile boundaries, GQA groups, head dims,
block sizes and dtypes. Each case is one interpreter run, so the grid is a chosen list, not a product."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import paged_attention_torch
from kernels.triton_paged_attention import paged_attention_triton, query_tile_rows
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)

CASES = {
    # name: (query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype)
    "pure-prefill": ([17, 40], [0, 0], 4, 4, 32, 16, torch.float32),
    "pure-decode": ([1, 1, 1], [15, 16, 70], 4, 2, 32, 16, torch.float32),
    "mixed-gqa4": ([1, 23, 1, 5], [40, 0, 16, 0], 8, 2, 32, 16, torch.float32),
    "chunks-on-cached-prefix": ([9, 33], [31, 64], 4, 2, 64, 16, torch.bfloat16),
    "block-size-8-fp16": ([20, 1], [12, 33], 4, 1, 32, 8, torch.float16),
    "head-dim-128-bf16": ([6, 1], [10, 20], 2, 1, 128, 16, torch.bfloat16),
    "group-3": ([7, 1], [5, 9], 6, 2, 32, 16, torch.float32),    # like Qwen's group of 7: not a power of two
    "head-dim-256": ([5, 1], [3, 40], 2, 1, 256, 16, torch.float32),
    # the demo and tiny test models (hidden 64, 4 heads): tl.dot's smallest K
    "head-dim-16-mixed": ([1, 37, 1], [40, 0, 70], 4, 4, 16, 16, torch.float32),
    "head-dim-16-gqa-bf16": ([9, 1], [31, 16], 4, 2, 16, 16, torch.bfloat16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mixed_batch_matches_reference(case):
    query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype = CASES[case]
    batch = make_paged_batch(query_lens, context_lens, num_heads=heads, num_kv_heads=kv_heads,
                             head_dim=head_dim, block_size=block_size, dtype=dtype)
    batch.write_new_tokens()
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, batch.scale)
    assert_close(paged_attention_triton(*args), paged_attention_torch(*args))


def test_long_prompt_spans_several_query_tiles():
    # 4 query heads per KV head and a 70-token prompt: BLOCK_M 64 holds 16 tokens, so 5 tiles, the last partial
    assert query_tile_rows(70, 1, 4, 64) == 64
    batch = make_paged_batch([70], [0], num_heads=4, num_kv_heads=1, head_dim=32)
    batch.write_new_tokens()
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, batch.scale)
    assert_close(paged_attention_triton(*args), paged_attention_torch(*args))


def test_writes_into_out_and_leaves_padding_rows_alone():
    batch = make_paged_batch([3, 1], [4, 20], num_heads=2, num_kv_heads=1, head_dim=32, padding_tokens=2)
    batch.write_new_tokens()
    out = torch.full_like(batch.query, 7.0)
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, batch.scale)
    result = paged_attention_triton(*args, out=out)
    assert result is out
    assert torch.all(out[4:] == 7.0)                          # padding rows belong to no request
    assert_close(out[:4], paged_attention_torch(*args)[:4])


def test_tile_rows_follow_the_batch_shape():
    assert query_tile_rows(num_tokens=32, num_seqs=32, group=1, max_rows=64) == 16     # all decode
    assert query_tile_rows(num_tokens=4096, num_seqs=2, group=4, max_rows=64) == 64   # long prefills
    assert query_tile_rows(num_tokens=8, num_seqs=8, group=32, max_rows=64) == 32     # big group
    assert query_tile_rows(num_tokens=4096, num_seqs=1, group=1, max_rows=32) == 32   # capped (fp32)


@pytest.mark.parametrize(
    "query_shape,cache_shape,message",
    [
        ((4, 6, 32), (3, 16, 4, 32), "not a multiple"),
        ((4, 2, 48), (3, 16, 1, 48), "head_dim 48"),
        ((4, 2, 8), (3, 16, 1, 8), "head_dim 8"),
        ((4, 2, 32), (3, 16, 1, 64), "differs"),
    ],
)
def test_inconsistent_shapes_are_rejected(query_shape, cache_shape, message):
    cache = torch.zeros(cache_shape)
    with pytest.raises(ValueError, match=message):
        paged_attention_triton(torch.zeros(query_shape), cache, cache, torch.tensor([0, 4], dtype=torch.int32),
                               torch.tensor([4], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), 1.0)


def test_query_start_loc_of_wrong_length_is_rejected():
    cache = torch.zeros(3, 16, 1, 32)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention_triton(torch.zeros(4, 2, 32), cache, cache, torch.tensor([0, 2, 4], dtype=torch.int32),
                               torch.tensor([4], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32), 1.0)


def test_query_with_permuted_strides_gets_a_contiguous_output():
    # a dense query whose last dimension is not the fastest one: the output must still be laid out [T, Hq, D]
    batch = make_paged_batch([6], [10], num_heads=2, num_kv_heads=1, head_dim=32)
    batch.write_new_tokens()
    permuted = batch.query.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    args = (batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
            batch.scale)
    out = paged_attention_triton(permuted, *args)
    assert out.is_contiguous()
    assert_close(out, paged_attention_torch(batch.query, *args))
