"""The persistent sampling state: seeded reproducibility, preemption, row moves, caching and validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.metadata import seeded_uniforms
from engine.sample.sampler import NUCLEUS_GUESS, Sampler, apply_logits_processors
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams
from tests.engine.sample.sampling_stats import (
    reference_distribution,
    single_torch_thread,  # noqa: F401  (autouse fixture)
)

VOCAB = 1000
EOS = VOCAB - 1

# One parameter set per sampling path: full-vocabulary, top-k candidates, top-p among candidates, top-p by
# rejection (flat logits below make the nucleus large).
PATHS = {
    "temperature": SamplingParams(temperature=0.9),
    "top_k_top_p": SamplingParams(temperature=0.7, top_k=20, top_p=0.95),
    "top_p_small": SamplingParams(temperature=1.0, top_p=0.05),
    "top_p_large": SamplingParams(temperature=1.0, top_p=0.6),
}


def test_the_paths_are_the_ones_named():
    logits = _logits(0, 0).numpy()
    assert (reference_distribution(logits, top_p=0.05) > 0).sum() < NUCLEUS_GUESS
    assert (reference_distribution(logits, top_p=0.6) > 0).sum() > NUCLEUS_GUESS


def _logits(request: int, position: int) -> torch.Tensor:
    """A request's logits at an output position: the same whatever its row or neighbours."""
    generator = torch.Generator().manual_seed(request * 100_003 + position)
    return torch.randn(VOCAB, generator=generator) * 0.5


class Engine:
    """Runs steps over a SamplingBatch the way the model runner does, with per-request logits."""

    def __init__(self, max_rows: int = 8, seed: int = 0) -> None:
        self.batch = SamplingBatch(max_rows, VOCAB, torch.device("cpu"), seed=seed)
        self.sampler = Sampler()
        self.rows: dict[int, int] = {}              # request -> row
        self.outputs: dict[int, list[int]] = {}

    def add(self, request: int, params: SamplingParams, row: int) -> None:
        output = self.outputs.setdefault(request, [])
        self.batch.add_request(row, params.resolved(), [1, 2, 3], list(output), [EOS])
        self.rows[request] = row

    def remove(self, request: int) -> None:
        self.batch.remove_request(self.rows.pop(request))

    def step(self) -> None:
        requests = list(self.rows)
        rows = np.array([self.rows[r] for r in requests])
        logits = torch.stack([_logits(r, len(self.outputs[r])) for r in requests])
        tokens = self.sampler(logits, self.batch.metadata(rows)).sampled_token_ids.numpy()
        self.batch.append_tokens(rows, tokens)
        for request, token in zip(requests, tokens.tolist(), strict=True):
            self.outputs[request].append(token)


@pytest.mark.parametrize("path", list(PATHS))
def test_seeded_request_is_independent_of_its_batch(path):
    params = PATHS[path].resolved()
    alone = Engine()
    alone.add(0, SamplingParams(**{**_fields(params), "seed": 1234}), row=0)
    crowded = Engine()
    for neighbour, row in ((1, 0), (2, 1), (3, 3)):
        crowded.add(neighbour, SamplingParams(**{**_fields(params), "seed": neighbour if neighbour == 3 else None}), row)
    crowded.add(0, SamplingParams(**{**_fields(params), "seed": 1234}), row=2)
    for _ in range(12):
        alone.step()
        crowded.step()
    assert alone.outputs[0] == crowded.outputs[0]
    assert len(set(alone.outputs[0])) > 3             # the draws are not degenerate


@pytest.mark.parametrize("path", list(PATHS))
def test_seeded_request_resumes_identically_after_preemption(path):
    params = SamplingParams(**{**_fields(PATHS[path].resolved()), "seed": 77})
    steady = Engine()
    steady.add(0, params, row=0)
    steady.add(1, PATHS[path], row=1)
    for _ in range(10):
        steady.step()

    preempted = Engine()
    preempted.add(0, params, row=0)
    preempted.add(1, PATHS[path], row=1)
    for _ in range(4):
        preempted.step()
    preempted.remove(0)                                # preempted: dropped from the executor ...
    preempted.step()
    preempted.add(0, params, row=5)                    # ... and re-added with its tokens, in another row
    for _ in range(6):
        preempted.step()
    assert preempted.outputs[0] == steady.outputs[0]


def test_different_seeds_give_different_sequences():
    runs = []
    for seed in (1, 2):
        engine = Engine()
        engine.add(0, SamplingParams(temperature=1.0, seed=seed), row=0)
        for _ in range(10):
            engine.step()
        runs.append(engine.outputs[0])
    assert runs[0] != runs[1]


def test_unseeded_rows_follow_the_engine_seed():
    """Tensor-parallel ranks build the same batch with the same seed: they must draw the same tokens."""
    def run(seed):
        engine = Engine(seed=seed)
        for request in range(4):
            engine.add(request, PATHS["top_k_top_p"] if request % 2 else PATHS["top_p_large"], row=request)
        for _ in range(8):
            engine.step()
        return engine.outputs

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_seeded_uniforms_are_uniform_and_keyed_on_seed_and_position():
    positions = np.arange(100_000)
    u = seeded_uniforms(np.full(len(positions), 42, np.uint64), positions)
    assert ((u > 0) & (u < 1)).all()
    counts = np.bincount((u * 20).astype(int), minlength=20)
    assert ((counts - 5000) ** 2 / 5000).sum() < 55    # chi-square, 19 dof, p ~ 1e-4
    again = seeded_uniforms(np.array([42, 43], np.uint64), np.array([7, 7]))
    assert again[0] == u[7] and again[1] != u[7]
    assert seeded_uniforms(np.array([42], np.uint64), np.array([7]), attempt=1)[0] != u[7]


def test_move_request_carries_penalty_state_and_parameters():
    batch = SamplingBatch(4, VOCAB, torch.device("cpu"), seed=0)
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=1.0, logit_bias={9: 3.0})
    batch.add_request(3, params.resolved(), [5], [6, 6], [EOS])
    before = torch.ones(1, VOCAB)
    apply_logits_processors(before, batch.metadata(np.array([3])))
    batch.move_request(3, 0)
    after = torch.ones(1, VOCAB)
    apply_logits_processors(after, batch.metadata(np.array([0])))
    assert torch.equal(before, after)
    assert after[0, 6] == pytest.approx(0.5 - 2.0) and after[0, 9] == pytest.approx(4.0 / 1.0)
    with pytest.raises(ValueError, match=r"rows \[3\] hold no request"):
        batch.metadata(np.array([3]))


def test_removed_request_leaves_nothing_behind():
    batch = SamplingBatch(2, VOCAB, torch.device("cpu"), seed=0)
    batch.add_request(0, SamplingParams(temperature=1.0, presence_penalty=1.0).resolved(), [1], [5, 7], [EOS])
    batch.remove_request(0)
    batch.add_request(0, SamplingParams(temperature=1.0, presence_penalty=1.0).resolved(), [1], [8], [EOS])
    logits = torch.zeros(1, VOCAB)
    apply_logits_processors(logits, batch.metadata(np.array([0])))
    assert torch.nonzero(logits[0]).flatten().tolist() == [8]


def test_metadata_reuses_the_layout_until_the_batch_changes():
    batch = SamplingBatch(4, VOCAB, torch.device("cpu"), seed=0)
    batch.add_request(0, PATHS["top_k_top_p"].resolved(), [1], [], [EOS])
    batch.add_request(1, SamplingParams(temperature=0.0).resolved(), [1], [], [EOS])
    rows = np.array([0, 1])
    first = batch.metadata(rows)
    batch.append_tokens(rows, np.array([4, 5]))
    second = batch.metadata(rows)
    assert second.top_k_group.inv_temperature is first.top_k_group.inv_temperature
    assert second.top_k_group.random.positions.tolist() == [1]     # the per-step part did change
    batch.add_request(2, SamplingParams(temperature=0.0).resolved(), [1], [], [EOS])
    third = batch.metadata(rows)
    assert third.top_k_group.inv_temperature is not first.top_k_group.inv_temperature
    assert batch.metadata(np.array([1, 0])).greedy_rows.tolist() == [0]


def test_bad_input_is_refused_with_a_clear_message():
    batch = SamplingBatch(2, VOCAB, torch.device("cpu"), seed=0)
    resolved = SamplingParams(temperature=1.0).resolved()
    with pytest.raises(ValueError, match="must be resolved"):
        batch.add_request(0, SamplingParams(), [1], [], [EOS])
    with pytest.raises(ValueError, match="outside"):
        batch.add_request(2, resolved, [1], [], [EOS])
    with pytest.raises(ValueError, match="logit_bias holds token id 5000"):
        batch.add_request(0, SamplingParams(temperature=1.0, logit_bias={5000: 1.0}).resolved(), [1], [], [EOS])
    with pytest.raises(ValueError, match="allowed_token_ids holds token id"):
        batch.add_request(0, SamplingParams(temperature=1.0, allowed_token_ids=[VOCAB]).resolved(), [1], [], [EOS])
    with pytest.raises(ValueError, match="logprobs must be at most"):
        batch.add_request(0, SamplingParams(temperature=1.0, logprobs=VOCAB + 1).resolved(), [1], [], [EOS])
    batch.add_request(0, resolved, [1], [], [EOS])
    with pytest.raises(ValueError, match="already holds a request"):
        batch.add_request(0, resolved, [1], [], [EOS])
    with pytest.raises(ValueError, match="holds no request"):
        batch.remove_request(1)
    with pytest.raises(ValueError, match=r"rows \[1\] hold no request"):
        batch.metadata(np.array([0, 1]))
    batch.add_request(1, resolved, [1], [], [EOS])
    with pytest.raises(ValueError, match="distinct"):
        batch.metadata(np.array([1, 1]))
    with pytest.raises(ValueError, match="same shape"):
        batch.append_tokens(np.array([0, 1]), np.array([3]))


def test_a_refused_request_leaves_its_row_clean():
    batch = SamplingBatch(1, VOCAB, torch.device("cpu"), seed=0)
    refused = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[4], logit_bias={VOCAB: 1.0})
    with pytest.raises(ValueError, match="logit_bias"):
        batch.add_request(0, refused.resolved(), [1], [], [EOS])
    batch.add_request(0, SamplingParams(temperature=0.0).resolved(), [1], [], [EOS])
    md = batch.metadata(np.array([0]))
    assert not md.modifies_logits and md.all_greedy


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__struct_fields__}
