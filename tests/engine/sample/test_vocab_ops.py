"""The two-level vocabulary operations agree with their one-level torch equivalents."""

from __future__ import annotations

import pytest
import torch

from engine.sample.vocab_ops import (
    BLOCK,
    Workspace,
    argmax_rows,
    block_reduce,
    count_greater,
    logsumexp_rows,
    sample_candidates,
    sample_rows,
    topk_rows,
)

RAGGED_VOCAB = 7 * BLOCK + 45


@pytest.mark.parametrize("vocab", [4 * BLOCK, RAGGED_VOCAB, BLOCK - 3])
def test_block_reduce_covers_the_ragged_tail(vocab):
    x = torch.randn(3, vocab)
    blocks = block_reduce(x, torch.amax)
    assert blocks.shape == (3, -(-vocab // BLOCK))
    assert torch.equal(blocks.amax(-1), x.amax(-1))
    assert torch.allclose(block_reduce(x, torch.sum).sum(-1), x.sum(-1), atol=1e-4)


def test_argmax_rows_matches_torch_on_all_rows_and_on_a_subset():
    x = torch.randn(6, RAGGED_VOCAB)
    x[0, RAGGED_VOCAB - 1] = 9.0                       # in the ragged last block
    x[1, 5] = x[1, 900] = 9.0                          # tie: the first wins
    block_max = block_reduce(x, torch.amax)
    assert torch.equal(argmax_rows(x, block_max, None), x.argmax(-1))
    rows = torch.tensor([4, 1, 0])
    assert torch.equal(argmax_rows(x, block_max, rows), x[rows].argmax(-1))


@pytest.mark.parametrize("k", [1, 5, 20])
def test_topk_rows_matches_torch(k):
    vocab = 60 * BLOCK + 17                            # large enough for the two-level path at these k
    x = torch.randn(5, vocab)
    x[2, vocab - 3] = 10.0
    block_max = block_reduce(x, torch.amax)
    rows = torch.tensor([2, 0, 4])
    values, ids = topk_rows(x, block_max, rows, k)
    expected_values, expected_ids = torch.topk(x[rows], k)
    assert torch.equal(values, expected_values) and torch.equal(ids, expected_ids)


def test_topk_rows_falls_back_to_torch_when_k_is_large():
    x = torch.randn(2, RAGGED_VOCAB)
    values, ids = topk_rows(x, block_reduce(x, torch.amax), None, 100)
    assert torch.equal(values, torch.topk(x, 100).values) and torch.equal(ids, torch.topk(x, 100).indices)


def test_sample_rows_is_the_inverse_cdf_and_skips_zero_weights():
    weights = torch.zeros(1, RAGGED_VOCAB)
    weights[0, 3], weights[0, 150], weights[0, RAGGED_VOCAB - 1] = 1.0, 2.0, 1.0
    cases = {0.0: 3, 0.24: 3, 0.26: 150, 0.74: 150, 0.76: RAGGED_VOCAB - 1, 1 - 2**-53: RAGGED_VOCAB - 1}
    for u, token in cases.items():
        drawn = sample_rows(weights, torch.tensor([u], dtype=torch.float64))
        assert drawn.item() == token, u


def test_sample_rows_never_returns_a_zero_weight_token():
    generator = torch.Generator().manual_seed(0)
    weights = torch.rand(64, RAGGED_VOCAB, generator=generator)
    weights[torch.rand(64, RAGGED_VOCAB, generator=generator) < 0.9] = 0.0
    uniforms = torch.cat([torch.tensor([0.0, 1 - 2**-53]), torch.rand(62, generator=generator, dtype=torch.float64)])
    drawn = sample_rows(weights, uniforms)
    assert (weights.gather(1, drawn.unsqueeze(1)) > 0).all()


def test_sample_rows_of_zero_weights_returns_a_valid_token():
    drawn = sample_rows(torch.zeros(2, RAGGED_VOCAB), torch.tensor([0.3, 0.9], dtype=torch.float64))
    assert ((drawn >= 0) & (drawn < RAGGED_VOCAB)).all()


def test_sample_candidates_keeps_the_exclusive_prefix_below_the_nucleus_mass():
    weights = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    # Exclusive prefix sums 0, 4, 7, 9: with nucleus mass 7 only the first two columns remain.
    for u, col in {0.0: 0, 0.56: 0, 0.58: 1, 1 - 2**-53: 1}.items():
        drawn = sample_candidates(weights, torch.tensor([7.0], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))
        assert drawn.item() == col, u
    # Without a nucleus every positive column takes part; zero columns never do.
    padded = torch.tensor([[4.0, 3.0, 0.0, 0.0]])
    assert sample_candidates(padded, None, torch.tensor([1 - 2**-53], dtype=torch.float64)).item() == 1


def test_logsumexp_rows_handles_logits_far_below_the_maximum():
    x = torch.randn(3, RAGGED_VOCAB)
    x[0, :500] = -300.0                                # would underflow exp
    x[1, 7] = float("-inf")
    out = Workspace().take(3, RAGGED_VOCAB, x.device)
    result = logsumexp_rows(x, x.amax(-1), out)
    assert torch.allclose(result, torch.logsumexp(x, -1), atol=1e-5)


def test_workspace_reuses_its_buffer_until_it_must_grow():
    workspace = Workspace()
    a = workspace.take(4, 10, torch.device("cpu"))
    b = workspace.take(2, 10, torch.device("cpu"))
    assert a.data_ptr() == b.data_ptr() and b.shape == (2, 10)
    assert workspace.take(8, 10, torch.device("cpu")).shape == (8, 10)


@pytest.mark.parametrize("likely", [True, False])
def test_count_greater_matches_a_full_comparison(likely):
    x = torch.randn(5, RAGGED_VOCAB)
    x[:, 200] += 6.0 if likely else 0.0               # a likely chosen token: few blocks are visited
    chosen = x[:, 200] if likely else x[:, 17]
    out = Workspace().take(5, RAGGED_VOCAB, x.device)
    counts = count_greater(x, block_reduce(x, torch.amax), chosen, out)
    assert torch.equal(counts, (x > chosen.unsqueeze(1)).sum(-1))
