"""Verifying draft tokens: which of them the target model accepts.

A request with drafts d1..dk is run over [last token, d1, .., dk] in one forward, and the sampler draws a
token t0..tk at each of those k + 1 positions from the target's distribution there, as if the drafts before
the position had been accepted (SamplingBatch.metadata with offsets: penalties, min_tokens, seeds and grammar
masks all follow that history). The request keeps t0..ta, where a is the number of leading drafts with
t(i-1) == di: the accepted drafts, then the target's own token at the first mismatch, or a bonus token when
every draft matched.

Greedy rows are exact: each t is the argmax the non-speculative run would take. For sampled rows this is
rejection sampling (Leviathan et al., Chen et al.) with the proposer's distribution q = a point mass on the
draft: a draft d is accepted with probability min(1, p(d) / q(d)) = p(d), and on rejection the token comes
from the residual norm(max(0, p - q)), which is p restricted to tokens other than d. Drawing t ~ p and
keeping d exactly when t == d has that same law: P(d) = p(d), and any other token x is drawn with
probability p(x) = (1 - p(d)) p(x | x != d). So every emitted token follows the target's distribution,
which tests/engine/sample/test_speculative.py checks by chi-square against the non-speculative sampler.
A seeded request draws its uniform number from (seed, output position), so it emits the very tokens the
non-speculative run emits, with or without drafts.
"""

from __future__ import annotations

import numpy as np


def runs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For consecutive runs of the given lengths: (which run each element belongs to, its index in it)."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    return owner, np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)


def accepted_lengths(sampled: np.ndarray, drafts: np.ndarray, num_rows: np.ndarray) -> np.ndarray:
    """How many tokens each request keeps: 1 + its leading drafts that equal the token sampled before them.

    sampled: the tokens drawn at every verify row, each request's 1 + k rows in a run (num_rows[i] = 1 + k);
    drafts: per row the draft that follows it (the next input token), ignored at each run's last row."""
    owner, offset = runs(num_rows)
    last = offset == num_rows[owner] - 1
    stops = last | (sampled != drafts)                    # the first stop of a run ends what it keeps
    first_stop = np.minimum.reduceat(np.where(stops, offset, np.iinfo(np.int64).max),
                                     np.cumsum(num_rows) - num_rows) if len(owner) else np.zeros(0, np.int64)
    return first_stop + 1
