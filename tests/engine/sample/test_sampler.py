"""The sampler draws from exactly the distribution each SamplingParams field defines.

Each distribution test samples the real Sampler (batches of identical rows, V = 300 so the last vocabulary
block is ragged) and runs a chi-square test against a reference computed here from the definitions. Each
also names a subtly wrong variant and checks that the same counts reject it, so the test has the power to
catch that mistake.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sample.sampler import NUCLEUS_GUESS, Sampler, apply_logits_processors
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams
from kernels.cpu import ops as cpu_ops
from tests.engine.sample.sampling_stats import (
    fits,
    reference_distribution,
    sample_counts,
    single_torch_thread,  # noqa: F401  (autouse fixture)
    softmax,
)

VOCAB = 300
N = 200_000


def _logits(scale: float, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=VOCAB) * scale).astype(np.float32)


def _nucleus_size(probs: np.ndarray) -> int:
    return int((probs > 0).sum())


@pytest.mark.parametrize("draw", ["torch", "c"])
def test_temperature_matches_softmax_of_scaled_logits(draw):
    """Both draws of rows without top-k/top-p: the torch ops and kernels/cpu/ops's (the executor's on CPUs)."""
    if draw == "c" and not cpu_ops.available():
        pytest.skip("kernels/cpu/ops does not run here")
    logits = _logits(1.5)
    sampler = Sampler(full_row_draw=cpu_ops.sample_exp_rows if draw == "c" else None)
    counts = sample_counts(logits, SamplingParams(temperature=0.7), num_samples=N, sampler=sampler)
    assert fits(counts, reference_distribution(logits, temperature=0.7))
    # Catches: temperature ignored, or multiplied instead of divided.
    assert not fits(counts, softmax(logits))
    assert not fits(counts, softmax(logits * 0.7))


def test_top_k_keeps_exactly_k_tokens():
    logits = _logits(1.0)
    counts = sample_counts(logits, SamplingParams(temperature=1.0, top_k=10), num_samples=N)
    assert fits(counts, reference_distribution(logits, top_k=10))
    # Catches: one token too many or too few.
    assert not fits(counts, reference_distribution(logits, top_k=11))
    assert not fits(counts, reference_distribution(logits, top_k=9))


def _nucleus_changed_by(expected: np.ndarray, probs: np.ndarray, tokens: int) -> np.ndarray:
    """The reference with its nucleus one token wider (tokens=1) or narrower (tokens=-1)."""
    order = np.argsort(-probs, kind="stable")
    size = _nucleus_size(expected)
    kept = np.zeros_like(probs)
    kept[order[: size + tokens]] = probs[order[: size + tokens]]
    return kept / kept.sum()


def test_top_p_small_nucleus_after_temperature():
    logits = _logits(4.0, seed=1)
    expected = reference_distribution(logits, temperature=2.0, top_p=0.8)
    assert _nucleus_size(expected) < NUCLEUS_GUESS          # found among the candidates
    counts = sample_counts(logits, SamplingParams(temperature=2.0, top_p=0.8), num_samples=N)
    assert fits(counts, expected)
    # Catches: the nucleus one token too large (inclusive cumsum) or too small.
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits / 2.0), 1))
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits / 2.0), -1))
    # Catches: the nucleus chosen on the T = 1 distribution and temperature applied afterwards.
    wrong_order = np.where(reference_distribution(logits, top_p=0.8) > 0, softmax(logits / 2.0), 0.0)
    assert not np.array_equal(wrong_order > 0, expected > 0)
    assert not fits(counts, wrong_order / wrong_order.sum())


def test_top_p_large_nucleus_by_rejection():
    logits = _logits(0.3, seed=2)                            # flat: the nucleus holds ~half the vocabulary
    expected = reference_distribution(logits, top_p=0.5)
    assert _nucleus_size(expected) > NUCLEUS_GUESS           # drawn by rejection
    counts = sample_counts(logits, SamplingParams(temperature=1.0, top_p=0.5), num_samples=N)
    assert fits(counts, expected)
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits), 1))
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits), -1))


@pytest.mark.parametrize("vocab, top_p, num_samples, rows_per_call", [
    (2000, 0.05, 60_000, 1024),    # a tiny nucleus share: many rounds with a rising pivot
    (500, 0.2, 6000, 2),           # two rows: often both rejected together, round after round
])
def test_top_p_rejection_over_several_rounds(vocab, top_p, num_samples, rows_per_call):
    logits = (np.random.default_rng(vocab).normal(size=vocab) * 0.2).astype(np.float32)
    expected = reference_distribution(logits, top_p=top_p)
    assert _nucleus_size(expected) > NUCLEUS_GUESS
    counts = sample_counts(logits, SamplingParams(temperature=1.0, top_p=top_p), num_samples=num_samples,
                           rows_per_call=rows_per_call)
    assert fits(counts, expected)
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits), 2))


def test_min_p_is_relative_to_the_top_probability_after_temperature():
    logits = _logits(1.5, seed=4)
    params = SamplingParams(temperature=1.5, min_p=0.1)
    expected = reference_distribution(logits, temperature=1.5, min_p=0.1)
    counts = sample_counts(logits, params, num_samples=N)
    assert fits(counts, expected)
    # Catches: min_p applied before temperature (on the T = 1 probabilities).
    before = np.where(reference_distribution(logits, min_p=0.1) > 0, softmax(logits / 1.5), 0.0)
    assert not np.array_equal(before > 0, expected > 0)
    assert not fits(counts, before / before.sum())


def test_min_p_top_k_top_p_together_in_vllm_order():
    logits = _logits(2.0, seed=5)
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.7, min_p=0.02)
    expected = reference_distribution(logits, temperature=0.9, top_k=8, top_p=0.7, min_p=0.02)
    counts = sample_counts(logits, params, num_samples=N)
    assert fits(counts, expected)
    # Catches: top-p measured on the whole distribution instead of the top-k survivors.
    full_nucleus = reference_distribution(logits, temperature=0.9, top_p=0.7, min_p=0.02) > 0
    top8 = reference_distribution(logits, temperature=0.9, top_k=8, min_p=0.02)
    wrong = np.where(full_nucleus, top8, 0.0)
    assert not np.array_equal(wrong > 0, expected > 0)
    assert not fits(counts, wrong / wrong.sum())


def _penalised(logits: np.ndarray, prompt: list[int], output: list[int], rep: float, freq: float, pres: float,
               repetition_on_negatives: str = "multiply") -> np.ndarray:
    out = logits.astype(np.float64).copy()
    seen = sorted(set(prompt) | set(output))
    for t in seen:
        if out[t] > 0 or repetition_on_negatives == "divide":
            out[t] /= rep
        else:
            out[t] *= rep
    for t in set(output):
        out[t] -= freq * output.count(t) + pres
    return out


def test_penalties_distribution():
    logits = _logits(1.0, seed=6)
    order = np.argsort(-logits)
    prompt = [int(order[0]), int(order[1]), int(order[-1]), int(order[150])]     # positive and negative logits
    output = [int(order[2])] * 3 + [int(order[3]), int(order[150])]
    params = SamplingParams(temperature=1.0, repetition_penalty=1.8, frequency_penalty=0.4, presence_penalty=0.3)
    counts = sample_counts(logits, params, num_samples=N, prompt=prompt, output=output)
    assert fits(counts, softmax(_penalised(logits, prompt, output, 1.8, 0.4, 0.3)))
    # Catches: repetition penalty dividing negative logits too; frequency counting prompt tokens.
    assert not fits(counts, softmax(_penalised(logits, prompt, output, 1.8, 0.4, 0.3, "divide")))
    assert not fits(counts, softmax(_penalised(logits, prompt, output + prompt, 1.8, 0.4, 0.3)))


# ----------------------------------------------------------------------------- deterministic behaviours
def _batch(params_list, vocab=VOCAB, prompts=None, outputs=None, eos=(VOCAB - 1,)):
    batch = SamplingBatch(len(params_list), vocab, torch.device("cpu"), seed=0)
    for row, params in enumerate(params_list):
        batch.add_request(row, params.resolved(), (prompts or {}).get(row, [0]), (outputs or {}).get(row, []),
                          list(eos))
    return batch, batch.metadata(np.arange(len(params_list)))


def test_greedy_is_argmax_including_ties_and_ragged_tail():
    logits = torch.randn(6, VOCAB)
    logits[1, 7] = logits[1, 200] = 50.0          # a tie: the first index wins, as torch.argmax
    logits[2, VOCAB - 1] = 50.0                   # the maximum in the ragged last block
    batch, md = _batch([SamplingParams(temperature=0.0)] * 6)
    out = Sampler()(logits.clone(), md)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.sampled_token_ids[1] == 7


def test_greedy_rows_mixed_with_sampled_rows():
    logits = torch.randn(4, VOCAB) * 3
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)]
    _, md = _batch(params)
    out = Sampler()(logits.clone(), md).sampled_token_ids
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
    assert out[1] in torch.topk(logits[1], 5).indices


def test_top_k_one_is_greedy():
    logits = torch.randn(3, VOCAB)
    _, md = _batch([SamplingParams(temperature=1.0, top_k=1)] * 3)
    assert md.all_greedy
    assert torch.equal(Sampler()(logits.clone(), md).sampled_token_ids, logits.argmax(-1))


def test_logit_bias_is_added_before_greedy():
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 5.0
    _, md = _batch([SamplingParams(temperature=0.0, logit_bias={42: 6.0, 3: -1.0}), SamplingParams(temperature=0.0)])
    processed = logits.clone()
    apply_logits_processors(processed, md)
    assert processed[0, 42] == 6.0 and processed[0, 3] == 4.0
    assert torch.equal(processed[1], logits[1])
    assert Sampler()(logits.clone(), md).sampled_token_ids.tolist() == [42, 3]


def test_allowed_token_ids_mask_everything_else():
    allowed = [5, 17, 250]
    logits = torch.randn(2, VOCAB)
    _, md = _batch([SamplingParams(temperature=1.0, allowed_token_ids=allowed), SamplingParams(temperature=1.0)])
    processed = logits.clone()
    apply_logits_processors(processed, md)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[allowed] = True
    assert torch.equal(processed[0, mask], logits[0, mask])
    assert torch.isneginf(processed[0, ~mask]).all()
    assert torch.equal(processed[1], logits[1])
    counts = sample_counts(logits[0].numpy(), SamplingParams(temperature=1.0, allowed_token_ids=allowed),
                           num_samples=20_000)
    expected = np.zeros(VOCAB)
    expected[allowed] = softmax(logits[0].numpy()[allowed])
    assert fits(counts, expected)


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_masks_stop_ids_until_reached(ignore_eos):
    eos, stop = VOCAB - 1, 11
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[stop], ignore_eos=ignore_eos)
    batch, _ = _batch([params], outputs={0: [1]}, eos=(eos,))
    logits = torch.zeros(1, VOCAB)
    logits[0, stop], logits[0, eos], logits[0, 20] = 10.0, 9.0, 1.0
    sampler, row = Sampler(), np.array([0])
    # Two more tokens are needed: the stop id is masked, and eos too unless ignore_eos (then it is no
    # stop token at all).
    for _ in range(2):
        token = sampler(logits.clone(), batch.metadata(row)).sampled_token_ids.item()
        assert token == (eos if ignore_eos else 20)
        batch.append_tokens(row, np.array([token]))
    assert sampler(logits.clone(), batch.metadata(row)).sampled_token_ids.item() == stop


def test_penalty_formulas_on_hand_made_logits():
    prompt, output = [0, 1], [2, 2, 3, 1]
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    _, md = _batch([params], prompts={0: prompt}, outputs={0: output})
    logits = torch.zeros(1, VOCAB)
    logits[0, :5] = torch.tensor([2.0, -2.0, 1.0, 0.5, 3.0])
    apply_logits_processors(logits, md)
    # 0: prompt, positive -> /2; 1: prompt+output once, negative -> *2 - 0.5 - 0.25;
    # 2: output twice -> /2 - 2*0.5 - 0.25; 3: output once -> /2 - 0.5 - 0.25; 4: unseen.
    assert logits[0, :5].tolist() == pytest.approx([1.0, -4.75, -0.75, -0.5, 3.0])
    assert (logits[0, 5:] == 0).all()


def test_penalties_follow_generated_tokens():
    params = SamplingParams(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5)
    batch, _ = _batch([params])
    row = np.array([0])
    batch.append_tokens(row, np.array([7]))
    batch.append_tokens(row, np.array([7]))
    logits = torch.zeros(1, VOCAB)
    apply_logits_processors(logits, batch.metadata(row))
    assert logits[0, 7] == pytest.approx(-2.0)
    assert (logits[0, :7] == 0).all() and (logits[0, 8:] == 0).all()


def test_sampler_rejects_logits_of_the_wrong_shape():
    _, md = _batch([SamplingParams(temperature=0.0)] * 2)
    with pytest.raises(ValueError, match="logits must have shape"):
        Sampler()(torch.zeros(3, VOCAB), md)



# ----------------------------------------------------------------------------- the sync-free (GPU) path
# Forced on CPU tensors: Sampler(sync_free=True) is what the logits get on CUDA (test_host_syncs checks that
# it makes no host sync, test_nucleus that its nucleus floor is exact).
def test_sync_free_top_p_large_nucleus():
    logits = _logits(0.3, seed=2)
    expected = reference_distribution(logits, top_p=0.5)
    assert _nucleus_size(expected) > NUCLEUS_GUESS           # drawn above the nucleus floor
    counts = sample_counts(logits, SamplingParams(temperature=1.0, top_p=0.5), num_samples=40_000, sync_free=True)
    assert fits(counts, expected)
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits), 1))
    assert not fits(counts, _nucleus_changed_by(expected, softmax(logits), -1))


def test_sync_free_small_nucleus_share_after_temperature_and_min_p():
    """A nucleus of 10 % of what min_p keeps: the CPU path rejects most first draws here, round after round."""
    vocab = 2000
    logits = (np.random.default_rng(vocab).normal(size=vocab) * 0.2).astype(np.float32)
    params = SamplingParams(temperature=0.8, min_p=0.3, top_p=0.1)
    expected = reference_distribution(logits, temperature=0.8, min_p=0.3, top_p=0.1)
    assert _nucleus_size(expected) > NUCLEUS_GUESS
    counts = sample_counts(logits, params, num_samples=20_000, rows_per_call=1000, sync_free=True)
    assert fits(counts, expected)
    # Catches: the nucleus measured before min_p, or two tokens too wide.
    before_min_p = reference_distribution(logits, temperature=0.8, top_p=0.1)
    assert not fits(counts, before_min_p)
    assert not fits(counts, _nucleus_changed_by(expected, reference_distribution(logits, temperature=0.8,
                                                                                 min_p=0.3), 2))


def test_sync_free_path_draws_the_cpu_paths_tokens_where_no_rejection_is_needed():
    """Rows whose nucleus fits among the candidates, rows without top-p, top-k and greedy rows: the same
    uniforms give the same tokens on both paths, step after step."""
    params = [SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=0.7),
              SamplingParams(temperature=1.2, top_p=0.9, min_p=0.05), SamplingParams(temperature=1.0, top_k=20),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_p=0.95, seed=5)]
    logits = torch.from_numpy(np.stack([_logits(4.0, seed=row) for row in range(len(params))]))
    for row, p in enumerate(params):
        if p.top_p is not None:
            assert _nucleus_size(reference_distribution(logits[row].numpy(), temperature=p.temperature,
                                                        top_p=p.top_p, min_p=p.min_p or 0.0)) < NUCLEUS_GUESS
    (cpu_batch, _), (gpu_batch, _) = _batch(params), _batch(params)
    cpu, gpu, rows = Sampler(sync_free=False), Sampler(sync_free=True), np.arange(len(params))
    for _ in range(5):
        expected = cpu(logits.clone(), cpu_batch.metadata(rows)).sampled_token_ids
        assert torch.equal(gpu(logits.clone(), gpu_batch.metadata(rows)).sampled_token_ids, expected)
        cpu_batch.append_tokens(rows, expected.numpy())
        gpu_batch.append_tokens(rows, expected.numpy())


def test_sync_free_seeded_rows_repeat_whatever_their_neighbours():
    """A seeded row's tokens follow from its seed, position and logits alone, flat or not: the same in a
    batch of other rows, in another order, under another engine seed, and on every run."""
    flat, peaked = _logits(0.3, seed=8), _logits(4.0, seed=9)
    seeded = {"a": (flat, SamplingParams(temperature=1.0, top_p=0.5, seed=11)),
              "b": (flat, SamplingParams(temperature=0.9, top_p=0.3, seed=12)),
              "c": (peaked, SamplingParams(temperature=1.0, top_p=0.9, seed=13))}
    other = (flat, SamplingParams(temperature=1.0, top_p=0.5))

    def run(order: list[str], engine_seed: int) -> dict[str, list[int]]:
        rows = [seeded[name] if name in seeded else other for name in order]
        batch = SamplingBatch(len(rows), VOCAB, torch.device("cpu"), seed=engine_seed)
        for row, (_, p) in enumerate(rows):
            batch.add_request(row, p.resolved(), [0], [], [VOCAB - 1])
        logits = torch.from_numpy(np.stack([row_logits for row_logits, _ in rows]))
        index, sampler = np.arange(len(rows)), Sampler(sync_free=True)
        drawn = {name: [] for name in seeded}
        for _ in range(4):
            tokens = sampler(logits.clone(), batch.metadata(index)).sampled_token_ids
            batch.append_tokens(index, tokens.numpy())
            for row, name in enumerate(order):
                if name in seeded:
                    drawn[name].append(int(tokens[row]))
        return drawn

    first = run(["a", "x", "b", "c"], engine_seed=0)
    assert run(["a", "x", "b", "c"], engine_seed=0) == first
    assert run(["x", "c", "x", "b", "a", "x"], engine_seed=1) == first
    assert len(set(first["a"])) > 1                          # each position draws afresh


@pytest.mark.skipif(not cpu_ops.available(), reason="kernels/cpu/ops does not run here")
@pytest.mark.parametrize("vocab", [300, 1003, 49152])
def test_c_draw_picks_the_torch_paths_tokens(vocab):
    """The C draw of rows without top-p (kernels/cpu/ops.sample_exp_rows) against the torch ops it replaces:
    the same uniforms give the same tokens, for temperatures, min_p floors, masked tokens, ragged vocabularies,
    rows among top-k, top-p and greedy rows, step after step."""
    plain = [SamplingParams(temperature=t) for t in (0.3, 0.7, 1.0, 1.5)]
    params = [*plain, SamplingParams(temperature=1.0, min_p=0.1), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=0.8, top_p=0.9),
              *plain, SamplingParams(temperature=2.0, seed=7)]
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(len(params), vocab, generator=generator)
    logits[1, : vocab // 2] = float("-inf")                     # half the vocabulary masked
    logits[2, torch.randperm(vocab, generator=generator)[:7]] += 12.0    # a peaked row
    rows = np.arange(len(params))
    drawn = {}
    for path in ("c", "torch"):
        batch = SamplingBatch(len(params), vocab, torch.device("cpu"), seed=3)
        for row, p in enumerate(params):
            batch.add_request(row, p.resolved(), [0], [], [vocab - 1])
        sampler, tokens = Sampler(full_row_draw=cpu_ops.sample_exp_rows if path == "c" else None), []
        for _ in range(6):
            step = sampler(logits.clone(), batch.metadata(rows)).sampled_token_ids
            batch.append_tokens(rows, step.numpy())
            tokens.append(step)
        drawn[path] = torch.stack(tokens)
    assert torch.equal(drawn["c"], drawn["torch"])
    assert (drawn["c"][:, 1] >= vocab // 2).all()                 # never a masked token
    assert len(set(drawn["c"][:, 3].tolist())) > 1                 # and it really samples


@pytest.mark.skipif(not cpu_ops.available(), reason="kernels/cpu/ops does not run here")
def test_c_draw_edges():
    """Uniforms at the ends pick the first and the last weighted token; a row without weight gives its last
    token (as the torch path); tokens under the floor (weight < 1) are never picked; rows index the logits."""
    logits = torch.full((3, 300), float("-inf"))
    logits[0, [5, 17, 299]] = 0.0
    logits[1, 40] = 1.0
    logits[1, 41] = 1.0 - 80.0                     # e^-80 of token 40: under the -70 floor
    ones, shift = torch.ones(3), torch.tensor([-70.0, 1.0 - 70.0, 0.0])
    low = cpu_ops.sample_exp_rows(logits, None, ones, shift, torch.tensor([0.0, 0.999999, 0.5], dtype=torch.float64))
    high = cpu_ops.sample_exp_rows(logits, None, ones, shift, torch.tensor([0.999999, 0.999999, 0.5],
                                                                           dtype=torch.float64))
    assert low.tolist() == [5, 40, 299] and high.tolist() == [299, 40, 299]
    picked = cpu_ops.sample_exp_rows(logits, torch.tensor([1, 0]), ones[:2], shift[[1, 0]],
                                      torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert picked.tolist() == [40, 17]
    with pytest.raises(ValueError, match="out of range"):
        cpu_ops.sample_exp_rows(logits, torch.tensor([3]), ones[:1], shift[:1], torch.zeros(1, dtype=torch.float64))
