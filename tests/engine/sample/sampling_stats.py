"""Test helpers for the sampler tests: exact reference distributions (float64, sort-based, written from the
definitions) and a chi-square goodness-of-fit check."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """Sampling tests run many small batches: on a shared 2-core machine one torch thread is faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# z for a one-sided tail of 1e-4: a correct sampler fails a check about once in 10,000 seeds.
Z_1E4 = 3.719


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max())
    return z / z.sum()


def reference_distribution(logits: np.ndarray, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                           min_p: float = 0.0) -> np.ndarray:
    """vLLM's order: temperature, min_p (vs the top probability), top_k, top_p over the renormalised rest."""
    probs = softmax(np.asarray(logits, np.float64) / temperature)
    keep = probs >= min_p * probs.max()
    order = np.argsort(-probs, kind="stable")
    if top_k:
        keep[order[top_k:]] = False
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    if top_p < 1.0:
        sorted_probs = probs[order]
        exclusive = np.cumsum(sorted_probs) - sorted_probs
        drop = order[exclusive >= top_p]
        probs[drop] = 0.0
        probs /= probs.sum()
    return probs


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, critical value at 1e-4) of counts against probs.

    Cells expected to get fewer than 5 samples are pooled into one. A sample in a cell of probability 0
    makes the statistic infinite: the sampler produced something impossible.
    """
    total = counts.sum()
    if (counts[probs == 0] > 0).any():
        return math.inf, 1, 0.0
    expected = probs * total
    big = expected >= 5
    observed = list(counts[big]) + [counts[(~big) & (probs > 0)].sum()]
    expect = list(expected[big]) + [expected[(~big) & (probs > 0)].sum()]
    if expect[-1] == 0:
        observed, expect = observed[:-1], expect[:-1]
    observed, expect = np.array(observed, np.float64), np.array(expect, np.float64)
    statistic = float(((observed - expect) ** 2 / expect).sum())
    df = max(len(expect) - 1, 1)
    # Wilson-Hilferty approximation of the chi-square quantile.
    critical = df * (1 - 2 / (9 * df) + Z_1E4 * math.sqrt(2 / (9 * df))) ** 3
    return statistic, df, critical


def fits(counts: np.ndarray, probs: np.ndarray) -> bool:
    statistic, _, critical = chi_square(counts, probs)
    return statistic < critical


def sample_counts(logits: np.ndarray, params: SamplingParams, *, num_samples: int, rows_per_call: int = 2048,
                  prompt: list[int] | None = None, output: list[int] | None = None, seed: int = 0,
                  sync_free: bool | None = None, sampler: Sampler | None = None) -> np.ndarray:
    """Token counts from num_samples draws: batches of identical rows (unseeded) through the real sampler
    (sync_free=True: on the path it takes on a GPU; or the given sampler)."""
    vocab = len(logits)
    batch = SamplingBatch(rows_per_call, vocab, torch.device("cpu"), seed=seed)
    for row in range(rows_per_call):
        batch.add_request(row, params.resolved(), prompt or [0], output or [], [vocab - 1])
    sampler = sampler or Sampler(sync_free=sync_free)
    rows = np.arange(rows_per_call)
    metadata = batch.metadata(rows)
    base = torch.tensor(logits, dtype=torch.float32).expand(rows_per_call, vocab)
    counts = np.zeros(vocab, np.int64)
    for _ in range(math.ceil(num_samples / rows_per_call)):
        tokens = sampler(base.clone(), metadata).sampled_token_ids
        counts += np.bincount(tokens.numpy(), minlength=vocab)
    return counts
