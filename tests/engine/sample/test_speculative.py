"""Verifying drafts: the accepted run, and the distribution of what speculative decoding emits.

The distribution test runs the real SamplingBatch and Sampler over verify rows (a request's row repeated at
each draft position, with offsets) and checks the joint law of the first two emitted tokens by chi-square:
against the exact p0(x0) p1(x1 | x0) computed here, and against the non-speculative sampler's own draws.
A subtly wrong verifier (keeping the draft position's token although the draft was rejected) must fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.sampler import Sampler, apply_logits_processors
from engine.sample.sampling_batch import SamplingBatch
from engine.sample.speculative import accepted_lengths, runs
from engine.sampling_params import SamplingParams
from tests.engine.sample.sampling_stats import (
    chi_square,
    fits,
    reference_distribution,
    single_torch_thread,  # noqa: F401  (autouse fixture)
)

VOCAB = 10
ROWS = 2000
ROUNDS = 12


def test_accepted_lengths_keep_the_leading_matches_then_one_token():
    # three requests: 2 drafts both right, 3 drafts with the second wrong, no drafts
    sampled = np.array([7, 8, 9, 4, 5, 6, 1, 3])
    drafts = np.array([7, 8, -1, 4, 0, 0, -1, -1])       # row i is checked against the draft after it
    assert accepted_lengths(sampled, drafts, np.array([3, 4, 1])).tolist() == [3, 2, 1]
    owner, offset = runs(np.array([3, 4, 1]))
    assert owner.tolist() == [0, 0, 0, 1, 1, 1, 1, 2] and offset.tolist() == [0, 1, 2, 0, 1, 2, 3, 0]


def _model():
    """Logits at the first position, and of the next token given the previous one."""
    rng = np.random.default_rng(7)
    return rng.normal(size=VOCAB).astype(np.float32) * 1.5, rng.normal(size=(VOCAB, VOCAB)).astype(np.float32) * 1.5


def _batch(params: SamplingParams, seed: int) -> SamplingBatch:
    batch = SamplingBatch(ROWS, VOCAB, torch.device("cpu"), seed=seed)
    for row in range(ROWS):
        batch.add_request(row, params.resolved(), [0], [], [VOCAB - 1])
    return batch


def _pairs_with_drafts(params: SamplingParams, drafts: list[int], wrong: bool = False) -> np.ndarray:
    """Counts of the first two emitted tokens (x0, x1) over ROWS x ROUNDS requests that verify `drafts`."""
    first, table = _model()
    sampler = Sampler()
    k = len(drafts)
    counts = np.zeros((VOCAB, VOCAB), np.int64)
    rows = np.repeat(np.arange(ROWS), k + 1)
    offsets = np.tile(np.arange(k + 1), ROWS)
    step_tokens = np.tile(np.array([0, *drafts]), ROWS)      # each request's inputs: last token, drafts
    token_index = np.arange(len(rows))
    logits = torch.tensor(np.stack([first, *(table[d] for d in drafts)]), dtype=torch.float32).repeat(ROWS, 1)
    next_inputs = np.tile(np.array([*drafts, -1]), ROWS)
    for r in range(ROUNDS):
        batch = _batch(params, seed=r)
        md = batch.metadata(rows, offsets, step_tokens, token_index)
        sampled = sampler(logits.clone(), md).sampled_token_ids.numpy()
        kept = accepted_lengths(sampled, next_inputs, np.full(ROWS, k + 1))
        x0 = sampled[::k + 1]
        x1 = sampled[1::k + 1].copy()
        short = kept < 2 if not wrong else np.zeros(ROWS, bool)
        if short.any():                      # the next step samples x1 after x0, without drafts
            batch.append_tokens(np.arange(ROWS), x0)
            plain = torch.tensor(table[x0], dtype=torch.float32)
            x1[short] = sampler(plain, batch.metadata(np.arange(ROWS))).sampled_token_ids.numpy()[short]
        np.add.at(counts, (x0, x1), 1)
    return counts.reshape(-1)


def _pairs_without_drafts(params: SamplingParams) -> np.ndarray:
    first, table = _model()
    sampler = Sampler()
    counts = np.zeros((VOCAB, VOCAB), np.int64)
    for r in range(ROUNDS):
        batch = _batch(params, seed=100 + r)
        rows = np.arange(ROWS)
        x0 = sampler(torch.tensor(first).repeat(ROWS, 1), batch.metadata(rows)).sampled_token_ids.numpy()
        batch.append_tokens(rows, x0)
        x1 = sampler(torch.tensor(table[x0]), batch.metadata(rows)).sampled_token_ids.numpy()
        np.add.at(counts, (x0, x1), 1)
    return counts.reshape(-1)


def _joint(params: SamplingParams) -> np.ndarray:
    params = params.resolved()
    first, table = _model()
    p0 = reference_distribution(first, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    rows = [reference_distribution(table[x], temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
            for x in range(VOCAB)]
    return (p0[:, None] * np.stack(rows)).reshape(-1)


def _same_law(a: np.ndarray, b: np.ndarray) -> bool:
    """Two-sample chi-square (homogeneity) at the 1e-4 level, on the cells both samples reach."""
    pooled = (a + b) / (a.sum() + b.sum())
    keep = pooled > 0
    statistic = 0.0
    for counts in (a, b):
        expected = pooled[keep] * counts.sum()
        statistic += float(((counts[keep] - expected) ** 2 / expected).sum())
    _, _, critical = chi_square(a, pooled)          # the same degrees of freedom
    return statistic < critical


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=6,
                                                                                     top_p=0.9)],
                         ids=["temperature", "top_k_top_p"])
def test_sampled_requests_emit_the_target_distribution(params):
    first, table = _model()
    likely = int(np.argmax(first))
    drafts = [likely, int(np.argmax(table[likely]))]      # often accepted, sometimes not
    counts = _pairs_with_drafts(params, drafts)
    assert fits(counts, _joint(params))
    assert _same_law(counts, _pairs_without_drafts(params))
    # Catches: a rejected draft's position still supplying the second token.
    assert not fits(_pairs_with_drafts(params, drafts, wrong=True), _joint(params))


def test_verify_rows_see_the_drafts_before_them_as_output():
    """Penalties and min_tokens at a draft position equal what the non-speculative step there sees."""
    params = SamplingParams(temperature=1.0, repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2,
                            min_tokens=3).resolved()
    drafts = [4, 4, 7]
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(4, VOCAB)), dtype=torch.float32)

    batch = SamplingBatch(2, VOCAB, torch.device("cpu"), seed=0)
    batch.add_request(1, params, [2, 4], [7], [VOCAB - 1])
    md = batch.metadata(np.array([1, 1, 1, 1]), np.arange(4), np.array([7, *drafts]), np.arange(4))
    speculative = logits.clone()
    apply_logits_processors(speculative, md)

    for offset in range(4):
        plain = SamplingBatch(2, VOCAB, torch.device("cpu"), seed=0)
        plain.add_request(1, params, [2, 4], [7, *drafts[:offset]], [VOCAB - 1])
        expected = logits[offset:offset + 1].clone()
        apply_logits_processors(expected, plain.metadata(np.array([1])))
        assert torch.equal(speculative[offset], expected[0]), f"draft position {offset}"
