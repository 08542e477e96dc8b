"""Logprobs are log_softmax of the raw logits: values, top-k, ranks; for sampled and for prompt tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.logprobs import (
    PROMPT_LOGITS_CHUNK_ROWS,
    PROMPT_LOGPROBS_CHUNK_ROWS,
    compute_logprobs,
    compute_prompt_logprobs,
    prompt_logprobs_from_hidden,
)
from engine.sample.sampler import Sampler
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams

VOCAB = 1000


def _check(result, logits: torch.Tensor, chosen: torch.Tensor, k: int) -> None:
    reference = torch.log_softmax(logits.double(), -1)
    top = torch.topk(reference, k)
    assert result.token_ids.dtype == torch.int32 and result.logprobs.dtype == torch.float32
    assert result.ranks.dtype == torch.int32
    assert torch.equal(result.token_ids[:, 0].long(), chosen)
    assert torch.equal(result.token_ids[:, 1:].long(), top.indices)
    chosen_lp = reference.gather(1, chosen.unsqueeze(1))
    assert torch.allclose(result.logprobs.double(), torch.cat([chosen_lp, top.values], 1), atol=1e-5)
    assert torch.equal(result.ranks.long(), (reference > chosen_lp).sum(-1) + 1)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_compute_logprobs_matches_log_softmax(k):
    logits = torch.randn(7, VOCAB) * 4
    chosen = torch.randint(0, VOCAB, (7,))
    chosen[0] = logits[0].argmax()                     # rank 1
    result = compute_logprobs(logits.clone(), chosen, k)
    _check(result, logits, chosen, k)
    assert result.ranks[0] == 1
    assert result.token_ids.shape == (7, 1 + k)


def test_prompt_logprobs_over_several_chunks():
    n = 2 * PROMPT_LOGPROBS_CHUNK_ROWS + 5
    logits = torch.randn(n, VOCAB) * 3
    targets = torch.randint(0, VOCAB, (n,))
    _check(compute_prompt_logprobs(logits, targets, 3), logits, targets, 3)


@pytest.mark.parametrize("n", [0, 1, PROMPT_LOGITS_CHUNK_ROWS, 3 * PROMPT_LOGITS_CHUNK_ROWS + 7])
def test_prompt_logits_are_computed_in_bounded_chunks(n):
    # review F3: an 8k-token prompt chunk at a 152k vocabulary must never hold all its logits at once
    gen = torch.Generator().manual_seed(n)
    hidden = torch.randn(n + 5, 16, generator=gen)
    head = torch.randn(16, VOCAB, generator=gen) * 2
    row_index = torch.randperm(n + 5, generator=gen)[:n]
    targets = torch.randint(0, VOCAB, (n,), generator=gen)
    rows_per_call = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        rows_per_call.append(rows.shape[0])
        return rows @ head

    result = prompt_logprobs_from_hidden(compute_logits, hidden, row_index, targets, 2)
    assert max(rows_per_call) <= PROMPT_LOGITS_CHUNK_ROWS
    assert sum(rows_per_call) == n
    unchunked = compute_prompt_logprobs(hidden[row_index] @ head, targets, 2)
    assert torch.equal(result.token_ids, unchunked.token_ids) and torch.equal(result.ranks, unchunked.ranks)
    torch.testing.assert_close(result.logprobs, unchunked.logprobs)
    _check(result, hidden[row_index] @ head, targets, 2)


def test_prompt_logprobs_of_a_one_token_prompt_is_empty():
    result = compute_prompt_logprobs(torch.zeros(0, VOCAB), torch.zeros(0, dtype=torch.int64), 2)
    assert result.num_rows == 0 and result.token_ids.shape == (0, 3)


def test_logprobs_reject_bad_arguments():
    with pytest.raises(ValueError, match="target_token_ids must have shape"):
        compute_prompt_logprobs(torch.zeros(3, VOCAB), torch.zeros(2, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="number of logprobs"):
        compute_logprobs(torch.zeros(1, VOCAB), torch.zeros(1, dtype=torch.int64), VOCAB + 1)


def test_sampler_logprobs_are_raw_and_follow_the_logprob_rows():
    """Penalties, bias, masks and temperature change what is sampled, never the reported logprobs."""
    params = [
        SamplingParams(temperature=0.5, logprobs=2, repetition_penalty=1.5, logit_bias={3: 5.0}),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=5, logprobs=0, allowed_token_ids=[1, 2, 3, 4, 5, 6]),
        SamplingParams(temperature=0.0, logprobs=4, min_tokens=2),
    ]
    batch = SamplingBatch(4, VOCAB, torch.device("cpu"), seed=0)
    for row, p in enumerate(params):
        batch.add_request(row, p.resolved(), [3, 4, 5], [], [VOCAB - 1])
    md = batch.metadata(np.arange(4))
    assert md.logprob_rows.tolist() == [0, 2, 3] and md.num_logprobs.tolist() == [2, 0, 4]
    logits = torch.randn(4, VOCAB) * 2
    logits[3, VOCAB - 1] = 20.0                        # eos, masked by min_tokens: not sampled
    out = Sampler()(logits.clone(), md)
    sampled = out.sampled_token_ids
    assert sampled[3] != VOCAB - 1
    assert out.logprobs.token_ids.shape == (3, 1 + md.max_num_logprobs)
    _check(out.logprobs, logits[[0, 2, 3]], sampled[[0, 2, 3]], md.max_num_logprobs)


def test_sampler_logprobs_of_an_untouched_full_batch():
    batch = SamplingBatch(3, VOCAB, torch.device("cpu"), seed=0)
    for row in range(3):
        batch.add_request(row, SamplingParams(temperature=1.0, logprobs=3).resolved(), [1], [], [0])
    logits = torch.randn(3, VOCAB) * 2
    out = Sampler()(logits.clone(), batch.metadata(np.arange(3)))
    _check(out.logprobs, logits, out.sampled_token_ids, 3)


def test_sampler_without_logprobs_returns_none():
    batch = SamplingBatch(1, VOCAB, torch.device("cpu"), seed=0)
    batch.add_request(0, SamplingParams(temperature=1.0).resolved(), [1], [], [0])
    assert Sampler()(torch.randn(1, VOCAB), batch.metadata(np.arange(1))).logprobs is None
