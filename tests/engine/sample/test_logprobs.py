"""Logprobs are log_softmax of the raw logits: values, top-k, ranks; for sampled and for prompt tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.logprobs import PROMPT_LOGPROBS_CHUNK_ROWS, compute_logprobs, compute_prompt_logprobs
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
