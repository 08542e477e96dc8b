"""TokenOccurrences agrees with a plain Counter model through adds, appends, moves and clears."""

from __future__ import annotations

from collections import Counter

import numpy as np

from engine.sample.token_occurrences import TokenOccurrences

VOCAB = 500


def _as_dict(occurrences: TokenOccurrences, rows: list[int]) -> dict[tuple[int, int], int]:
    owner, tokens, counts = occurrences.gather(np.array(rows, dtype=np.int64))
    return {(rows[o], t): c for o, t, c in zip(owner.tolist(), tokens.tolist(), counts.tolist(), strict=True)}


def _expected(model: dict[int, tuple[set, Counter]], rows: list[int]) -> dict[tuple[int, int], int]:
    out = {}
    for row in rows:
        prompt, output = model[row]
        for token in prompt | set(output):
            out[(row, token)] = output[token]
    return out


def test_random_operations_match_a_counter_model():
    rng = np.random.default_rng(0)
    occurrences = TokenOccurrences(8, VOCAB)
    model: dict[int, tuple[set, Counter]] = {}
    free = list(range(8))
    for _ in range(300):
        action = rng.integers(4)
        if action == 0 and free:
            row = free.pop(rng.integers(len(free)))
            prompt = rng.integers(0, VOCAB, rng.integers(1, 40))
            output = rng.integers(0, 20, rng.integers(0, 10))
            occurrences.add(row, prompt, output)
            model[row] = (set(prompt.tolist()), Counter(output.tolist()))
        elif action == 1 and model:
            rows = np.array(sorted(model), dtype=np.int64)
            tokens = rng.integers(0, 30, len(rows))      # small ids: repeats and first sightings both occur
            occurrences.append(rows, tokens)
            for row, token in zip(rows.tolist(), tokens.tolist(), strict=True):
                model[row][1][token] += 1
        elif action == 2 and model and free:
            src = sorted(model)[rng.integers(len(model))]
            dst = free.pop(rng.integers(len(free)))
            occurrences.move(src, dst)
            model[dst] = model.pop(src)
            free.append(src)
        elif action == 3 and model:
            row = sorted(model)[rng.integers(len(model))]
            occurrences.clear(row)
            del model[row]
            free.append(row)
        rows = sorted(model)
        assert _as_dict(occurrences, rows) == _expected(model, rows)
    # Cleared rows leave no trace in the dense table.
    table = occurrences.table.copy()
    for row in free:
        assert not table[row].any()


def test_the_seen_list_grows_past_its_first_capacity():
    occurrences = TokenOccurrences(2, VOCAB)
    occurrences.add(1, np.arange(100), np.array([], dtype=np.int64))
    for token in range(100, 300):
        occurrences.append(np.array([1]), np.array([token]))
    _, tokens, counts = occurrences.gather(np.array([1]))
    assert sorted(tokens.tolist()) == list(range(300))
    assert counts.sum() == 200
