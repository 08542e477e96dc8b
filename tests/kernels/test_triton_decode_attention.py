"""paged_decode_attention_triton (split-K decode) against paged_decode_attention_torch, under Triton's
interpreter on the CPU: context lengths on and across block and tile boundaries, split counts that leave
some splits empty, GQA groups, head dims and dtypes."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import paged_decode_attention_torch
from kernels.triton_decode_attention import MAX_SPLITS, default_num_splits, paged_decode_attention_triton
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)

CASES = {
    # name: (seq_lens, heads, kv_heads, head_dim, block_size, dtype, num_splits)
    "one-split": ([1, 16, 17, 100], 2, 2, 32, 16, torch.float32, 1),
    "splits-some-empty": ([1, 70, 130], 4, 2, 32, 16, torch.float32, 4),
    "gqa4-bf16": ([33, 129], 8, 2, 64, 16, torch.bfloat16, 3),
    "gqa8-block8-fp16": ([65, 9], 8, 1, 32, 8, torch.float16, 2),
    "head-dim-128": ([40, 97], 2, 1, 128, 16, torch.bfloat16, 2),
    "head-dim-256": ([50], 2, 2, 256, 16, torch.float16, 2),
    "default-splits": ([200], 1, 1, 32, 16, torch.float32, None),
    "head-dim-16": ([1, 17, 80], 4, 4, 16, 16, torch.float32, 2),
    "head-dim-16-gqa-bf16": ([33, 64], 4, 2, 16, 16, torch.bfloat16, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_decode_matches_reference(case):
    seq_lens, heads, kv_heads, head_dim, block_size, dtype, num_splits = CASES[case]
    batch = make_paged_batch([1] * len(seq_lens), [s - 1 for s in seq_lens], num_heads=heads,
                             num_kv_heads=kv_heads, head_dim=head_dim, block_size=block_size, dtype=dtype)
    batch.write_new_tokens()
    args = (batch.query, batch.key_cache, batch.value_cache, batch.seq_lens, batch.block_tables, batch.scale)
    assert_close(paged_decode_attention_triton(*args, num_splits=num_splits), paged_decode_attention_torch(*args))


def test_empty_request_gives_zeros_and_writes_into_out():
    # seq_len 0 stands for a CUDA-graph padding slot: no NaN may come out of it
    batch = make_paged_batch([1, 1], [20, 0], num_heads=2, num_kv_heads=1, head_dim=32)
    batch.write_new_tokens()
    seq_lens = torch.tensor([21, 0], dtype=torch.int32)
    out = torch.full_like(batch.query, float("nan"))
    result = paged_decode_attention_triton(batch.query, batch.key_cache, batch.value_cache, seq_lens,
                                           batch.block_tables, batch.scale, num_splits=2, out=out)
    assert result is out
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    expected = paged_decode_attention_torch(batch.query[:1], batch.key_cache, batch.value_cache, seq_lens[:1],
                                            batch.block_tables[:1], batch.scale)
    assert_close(out[:1], expected)


def test_default_split_count_fills_the_device_and_depends_on_shape_only():
    assert default_num_splits(num_seqs=1, num_kv_heads=8, num_sms=132) == MAX_SPLITS   # long single stream
    assert default_num_splits(num_seqs=8, num_kv_heads=8, num_sms=132) == 16
    assert default_num_splits(num_seqs=256, num_kv_heads=8, num_sms=132) == 1          # batch fills it alone


def test_seq_lens_must_match_the_query_rows():
    cache = torch.zeros(3, 16, 1, 32)
    with pytest.raises(ValueError, match="one query token per request"):
        paged_decode_attention_triton(torch.zeros(2, 1, 32), cache, cache, torch.tensor([4, 5, 6], dtype=torch.int32),
                                      torch.zeros(3, 1, dtype=torch.int32), 1.0)
