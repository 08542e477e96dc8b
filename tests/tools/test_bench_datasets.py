"""The synthetic datasets hold their token lengths with real tokenizers, and the prefix is shared."""

from __future__ import annotations

import os

import pytest

from tools.bench_datasets import length_range, sample_prefix_repetition, sample_requests, sample_sentences


@pytest.fixture(params=["qwen3", "llama3"])
def tokenizer(request, shared_tokenizer):
    return shared_tokenizer(request.param)


def _server_len(tokenizer, prompt: str) -> int:
    return len(tokenizer(prompt).input_ids)  # as a server counts it: with the special tokens


def test_random_prompts_have_the_asked_token_length(tokenizer):
    requests = sample_requests(tokenizer, 12, input_len=200, output_len=7, seed=1)
    assert [_server_len(tokenizer, r.prompt) for r in requests] == [200] * 12
    assert all(r.prompt_len == 200 and r.expected_output_len == 7 for r in requests)
    assert len({r.prompt for r in requests}) == 12


def test_range_ratio_spreads_lengths_within_bounds(tokenizer):
    requests = sample_requests(tokenizer, 30, input_len=100, output_len=20, range_ratio=0.5, seed=2)
    lens = [_server_len(tokenizer, r.prompt) for r in requests]
    assert lens == [r.prompt_len for r in requests]
    assert all(50 <= n <= 150 for n in lens) and len(set(lens)) > 5
    outs = [r.expected_output_len for r in requests]
    assert all(10 <= n <= 30 for n in outs) and len(set(outs)) > 5


def test_prefix_dataset_shares_its_prefix(tokenizer):
    requests = sample_requests(tokenizer, 10, input_len=40, output_len=4, prefix_len=64, seed=3)
    prefix = os.path.commonprefix([r.prompt for r in requests])
    assert len(tokenizer.encode(prefix, add_special_tokens=False)) >= 64
    ids = [tokenizer.encode(r.prompt, add_special_tokens=False) for r in requests]
    assert all(i[:64] == ids[0][:64] for i in ids)
    assert len({tuple(i[64:]) for i in ids}) == 10  # the suffixes differ
    assert [_server_len(tokenizer, r.prompt) for r in requests] == [104] * 10


def test_same_seed_same_prompts(tokenizer):
    a = sample_requests(tokenizer, 3, input_len=30, output_len=4, seed=5)
    assert a == sample_requests(tokenizer, 3, input_len=30, output_len=4, seed=5)
    assert a != sample_requests(tokenizer, 3, input_len=30, output_len=4, seed=6)


def test_length_range_matches_vllm():
    assert length_range(100, 0.25) == (75, 125)
    assert length_range(10, 0.33) == (6, 14)  # floor low, ceil high


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_requests": 0}, "num_prompts"),
        ({"range_ratio": 1.0}, "random_range_ratio"),
        ({"output_len": 0}, "random_output_len"),
        ({"input_len": 0}, "no prompt tokens"),
    ],
)
def test_bad_dataset_options_are_named(tokenizer, kwargs, message):
    options = {"num_requests": 2, "input_len": 10, "output_len": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        sample_requests(tokenizer, **options)


def test_prefix_repetition_groups_prompts_by_prefix_and_shuffles_them(tokenizer):
    requests = sample_prefix_repetition(tokenizer, 12, num_prefixes=3, prefix_len=48, suffix_len=10, output_len=5,
                                        seed=4)
    assert len(requests) == 12 and all(r.expected_output_len == 5 for r in requests)
    heads = [tuple(tokenizer.encode(r.prompt, add_special_tokens=False)[:48]) for r in requests]
    assert sorted(heads.count(h) for h in set(heads)) == [4, 4, 4]
    assert heads != sorted(heads, key=heads.index)             # interleaved, not in blocks of a group
    assert all(_server_len(tokenizer, r.prompt) == r.prompt_len for r in requests)
    with pytest.raises(ValueError, match="num_prefixes"):
        sample_prefix_repetition(tokenizer, 2, num_prefixes=3, prefix_len=8, suffix_len=1, output_len=1)


def test_sentences_are_single_sentences_with_their_server_length(tokenizer):
    requests = sample_sentences(tokenizer, 8, seed=3)
    assert [r.prompt for r in requests] == [r.prompt for r in sample_sentences(tokenizer, 8, seed=3)]
    assert all(r.prompt.endswith(".") and r.prompt.count(".") == 1 for r in requests)
    assert [r.prompt_len for r in requests] == [_server_len(tokenizer, r.prompt) for r in requests]
