"""nucleus_floor finds, exactly, the smallest weight of the top-p nucleus as the sampler defines it: a token
is in the nucleus when the tokens strictly heavier than it weigh less than top_p x the row's total. The
weights here are integers (or powers of two), so every sum is exact and the reference, written from the
definition by comparing every pair of tokens, has no rounding to disagree about."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.nucleus import SEGMENT, nucleus_floor, padded_width, segment_width


def _reference_floor(weights: np.ndarray, top_p: float) -> float:
    w = weights.astype(np.float64)
    heavier = (w[None, :] > w[:, None]).astype(np.float64) @ w
    inside = (w > 0) & (heavier < np.float64(np.float32(top_p)) * w.sum())
    return float(w[inside].min())


def _floors(rows: list[np.ndarray], top_p: list[float], segment: int) -> list[float]:
    weights = torch.tensor(np.stack(rows), dtype=torch.float32)
    return nucleus_floor(weights, segment, torch.tensor(top_p, dtype=torch.float32)).tolist()


def test_floor_matches_the_definition_on_random_rows():
    rng = np.random.default_rng(0)
    vocab, segment = 512, 64                              # 8 segments
    rows, top_p = [], []
    for i in range(60):
        w = rng.integers(1, [3, 40, 5000][i % 3], vocab).astype(np.float32)        # many ties, some, few
        w[rng.random(vocab) < [0.0, 0.3, 0.9][i % 3]] = 0.0                          # dropped tokens
        rows.append(w)
        top_p.append([1.0, 0.9, 0.5, 1e-3, float(rng.random())][i % 5])
    floors = _floors(rows, top_p, segment)
    assert floors == [_reference_floor(w, p) for w, p in zip(rows, top_p, strict=True)]


def test_floor_separates_neighbouring_floats():
    """Near 2^24 consecutive float32 values are 2 apart: the last round must tell them apart."""
    rng = np.random.default_rng(1)
    rows = [(2.0**24 + 2 * rng.permutation(300) % 40).astype(np.float32) for _ in range(8)]
    top_p = [0.1, 0.3, 0.5, 0.7, 0.9, 0.97, 0.999, 1.0]
    floors = _floors(rows, top_p, 100)
    assert floors == [_reference_floor(w, p) for w, p in zip(rows, top_p, strict=True)]
    assert len(set(floors)) > 4


def test_floor_over_the_whole_weight_range():
    """Kept weights run from 1 to e^70 (~2^101): powers of two over that range, and single-token rows."""
    powers = (2.0 ** np.arange(101)).astype(np.float32)
    lone = np.zeros(101, np.float32)
    lone[40] = 3.0
    ties = np.full(101, 2.0**100, np.float32)
    floors = _floors([powers, powers, powers, lone, lone, ties], [0.5, 0.9, 1.0, 0.01, 1.0, 0.01], 101)
    # 0.9: 2^100 + 2^99 + 2^98 < 0.9 x 2^101 <= that + 2^97, so 2^97 is the lightest token inside.
    assert floors == [2.0**100, 2.0**97, 1.0, 3.0, 3.0, 2.0**100]


@pytest.mark.parametrize("vocab, segment, width", [(300, 300, 300), (4096, 4096, 4096), (20_000, SEGMENT, 20_480),
                                                   (151_936, SEGMENT, 155_648)])
def test_rows_are_padded_to_whole_segments(vocab, segment, width):
    assert (segment_width(vocab), padded_width(vocab)) == (segment, width)
