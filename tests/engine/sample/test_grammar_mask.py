"""The grammar bitmask in the executor: unpacking, masking the logits before the sampler (so logprobs see
it), adversarial logits, and the empty-row rule (allowed_token_ids / min_tokens / logit_bias against a
grammar: the grammar wins)."""

from __future__ import annotations

import numpy as np
import torch

from engine.sample.grammar_mask import GrammarMask, allowed_from_bitmask, apply_bitmask
from engine.sample.sampler import Sampler
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams
from engine.structured_spec import unpack_allowed, words_per_row

VOCAB = 300     # ragged: 300 = 9 words and 12 bits


def pack(allowed: np.ndarray) -> np.ndarray:
    """bool [R, V] -> packed int32 [R, W], bit j of word i = token 32*i + j (the wire layout)."""
    rows, vocab = allowed.shape
    padded = np.zeros((rows, words_per_row(vocab) * 32), dtype=np.uint8)
    padded[:, :vocab] = allowed
    return np.packbits(padded, axis=1, bitorder="little").view("<i4").astype(np.int32)


def random_allowed(rows: int, seed: int, density: float = 0.1) -> np.ndarray:
    allowed = np.random.default_rng(seed).random((rows, VOCAB)) < density
    allowed[:, 0] |= ~allowed.any(1)
    return allowed


def test_unpacking_agrees_with_numpy_and_the_wire_layout():
    allowed = random_allowed(5, 0, density=0.5)
    bitmask = pack(allowed)
    assert bitmask.shape == (5, 10)
    assert np.array_equal(unpack_allowed(bitmask, VOCAB), allowed)
    assert np.array_equal(allowed_from_bitmask(torch.from_numpy(bitmask), VOCAB).numpy(), allowed)
    # bit 0 of word 1 is token 32; -1 allows everything
    one = np.zeros((1, 10), np.int32)
    one[0, 1] = 1
    assert np.flatnonzero(unpack_allowed(one, VOCAB)).tolist() == [32]
    assert unpack_allowed(np.full((1, 10), -1, np.int32), VOCAB).all()


def test_apply_masks_only_the_named_rows():
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    allowed = random_allowed(2, 1)
    apply_bitmask(logits, torch.from_numpy(pack(allowed)), torch.tensor([3, 1]))
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    for row, mask in ((3, allowed[0]), (1, allowed[1])):
        assert torch.isneginf(logits[row][~torch.from_numpy(mask)]).all()
        assert torch.equal(logits[row][torch.from_numpy(mask)], before[row][torch.from_numpy(mask)])


def sample(params: list[SamplingParams], logits: torch.Tensor, allowed: np.ndarray | None, rows: list[int],
           eos: list[int] | None = None):
    batch = SamplingBatch(len(params), VOCAB, torch.device("cpu"), seed=0)
    for row, p in enumerate(params):
        batch.add_request(row, p.resolved(), [1, 2], [], eos or [])
    metadata = batch.metadata(np.arange(len(params)))
    grammar = None
    if allowed is not None:
        grammar = GrammarMask.apply(logits, pack(allowed), np.array(rows), keep=metadata.modifies_logits)
    return Sampler()(logits, metadata, grammar)


def test_adversarial_logits_never_yield_a_forbidden_token():
    """The maximum logit sits on a forbidden token in every row; greedy, sampled and top-k rows all stay
    inside the grammar, and the logprobs (taken from the masked logits) give forbidden tokens -inf."""
    rows = 6
    allowed = random_allowed(rows, 2, density=0.05)
    params = [SamplingParams(temperature=0.0, logprobs=5), SamplingParams(temperature=1.0, logprobs=5),
              SamplingParams(temperature=1.5, top_k=50), SamplingParams(temperature=1.0, top_p=0.9),
              SamplingParams(temperature=0.7, min_p=0.1), SamplingParams(temperature=1.0, seed=3, logprobs=20)]
    for trial in range(20):
        logits = torch.randn(rows, VOCAB)
        forbidden = [int(np.flatnonzero(~allowed[r])[trial]) for r in range(rows)]
        logits[torch.arange(rows), forbidden] = 50.0
        out = sample(params, logits, allowed, list(range(rows)))
        tokens = out.sampled_token_ids.tolist()
        assert all(allowed[r, t] for r, t in enumerate(tokens)), (trial, tokens)
        lp = out.logprobs
        for j, r in enumerate([0, 1, 5]):
            assert lp.token_ids[j, 0].item() == tokens[r]
            assert np.isfinite(lp.logprobs[j, 0].item())
            top_ids = lp.token_ids[j, 1:].tolist()
            top_values = lp.logprobs[j, 1:].tolist()
            for token, value in zip(top_ids, top_values, strict=True):
                assert allowed[r, token] or value == float("-inf")


def test_unconstrained_rows_are_untouched_in_a_mixed_batch():
    logits = torch.randn(3, VOCAB)
    logits[1, 7] = 40.0
    allowed = random_allowed(1, 3)
    allowed[0, 7] = False
    params = [SamplingParams(temperature=0.0)] * 3
    out = sample(params, logits.clone(), allowed, [0])
    reference = sample(params, logits.clone(), None, [])
    assert out.sampled_token_ids[1:].tolist() == reference.sampled_token_ids[1:].tolist()
    assert out.sampled_token_ids[1].item() == 7


def test_a_row_emptied_by_allowed_token_ids_falls_back_to_the_grammar():
    allowed = np.zeros((1, VOCAB), bool)
    allowed[0, [10, 11]] = True
    logits = torch.randn(1, VOCAB)
    out = sample([SamplingParams(temperature=1.0, allowed_token_ids=[5, 6])], logits, allowed, [0])
    assert out.sampled_token_ids.item() in (10, 11)


def test_a_row_emptied_by_min_tokens_falls_back_to_the_grammar():
    """The grammar allows only EOS while min_tokens forbids it: the grammar wins, EOS is sampled."""
    eos = 42
    allowed = np.zeros((2, VOCAB), bool)
    allowed[:, eos] = True
    allowed[1, 3] = True
    params = [SamplingParams(temperature=1.0, min_tokens=5), SamplingParams(temperature=0.0, min_tokens=5)]
    out = sample(params, torch.randn(2, VOCAB), allowed, [0, 1], eos=[eos])
    # row 0 had nothing left but EOS; row 1 still had token 3, so min_tokens held there
    assert out.sampled_token_ids.tolist() == [eos, 3]


def test_logit_bias_works_inside_the_grammar():
    allowed = np.zeros((1, VOCAB), bool)
    allowed[0, [20, 21, 22]] = True
    logits = torch.zeros(1, VOCAB)
    logits[0, 20] = 5.0
    out = sample([SamplingParams(temperature=0.0, logit_bias={22: 100.0, 99: 100.0})], logits, allowed, [0])
    assert out.sampled_token_ids.item() == 22
