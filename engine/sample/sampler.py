"""The sampler: one step's logits [S, V] -> one token per row, for every SamplingParams field, batched.

Order of operations, as vLLM v1's Sampler applies them:
  0. raw logprobs are taken first (log_softmax of the model's logits, vLLM's default "raw_logprobs");
  1. allowed_token_ids: every other token to -inf;
  2. min_tokens: the stop ids (stop_token_ids, plus the EOS ids unless ignore_eos) to -inf while fewer than
     min_tokens tokens were generated; then logit_bias is added;
  3. penalties over the seen tokens: repetition (HF: positive logits divided, negative multiplied; prompt
     and output tokens), then frequency (times the output count) and presence (once per output token);
  4. greedy rows (temperature < 1e-5) take the argmax here;
  5. temperature, then min_p (drop tokens below min_p x the top probability), then top_k, then top_p over
     what survived (renormalised), then the draw.
Steps 1-3 write into `logits` in place (the caller's tensor is consumed).

Cost on the CPU is set by passes over [S, V]. Rows are split once per batch change into three groups, and
a group no row needs costs nothing:
  greedy      argmax from block maxima (engine/vocab_ops.py);
  top-k rows  top-k candidates from block maxima, and everything after on [S, k];
  full rows   (no top-k) exp weights over the whole vocabulary, then a two-level inverse-CDF draw; top-p
              looks for the nucleus among the 64 most likely tokens first and, where it is larger (flat
              distributions), draws by rejection with a rising pivot (FlashInfer's scheme), never sorting V.
              Without top-p, on a CPU, a `full_row_draw` given by the executor (kernels/cpu/ops's
              `sample_exp_rows`: the same weights and draw in one C pass per row) replaces the torch ops:
              ~0.5 -> ~0.2 ms a step at one row of 49k.
Every row draws one uniform number per attempt (engine/sample/metadata.py says where it comes from).

On a GPU a read of a device value on the host drains the stream (review F4), so rows on CUDA take a
sync-free path instead of the CPU's tuned one: the exp weights skip no pass, and top-p is decided with fixed
shapes and drawn once (engine/sample/nucleus.py). Either way each row draws from the same distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine.sample.grammar_mask import GrammarMask
from engine.sample.logprobs import LogprobsTensors, compute_logprobs
from engine.sample.metadata import PenaltyTensors, SamplingGroup, SamplingMetadata
from engine.sample.nucleus import nucleus_floor, padded_width, segment_width
from engine.sample.transfer import to_device
from engine.sample.vocab_ops import (
    Workspace,
    argmax_rows,
    block_reduce,
    sample_candidates,
    sample_rows,
    topk_rows,
)

NUCLEUS_GUESS = 64           # top-p: candidates tried before the rejection draw over the whole vocabulary
# Full-vocabulary weights keep tokens within e^70 of the most likely one (or min_p of it): the rest, each
# below 4e-31 of the top token, are dropped. This keeps every weight in [1, e^70], so sums cannot overflow
# float32 and "kept" is a single threshold at 1.
LOG_WEIGHT_FLOOR = -70.0
_BELOW_ONE = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
# (logits [S, V] float32, rows int64 [n] or None, inv_temperature [n], shift [n], uniforms float64 [n]) -> int64 [n]
FullRowDraw = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor          # int64 [S]
    logprobs: LogprobsTensors | None         # rows = metadata.logprob_rows, with 1 + max_num_logprobs
                                             # columns; row j's request wants 1 + metadata.num_logprobs[j]


class Sampler:
    def __init__(self, sync_free: bool | None = None, full_row_draw: FullRowDraw | None = None) -> None:
        """sync_free: take the path that reads nothing back to the host (the GPU's) on any device; None
        takes it exactly when the logits are on CUDA. Tests force it to check that path on a CPU.
        full_row_draw: where given, CPU rows without top-k or top-p are drawn by it in one call, with
        weights exp(l * inv_temperature - shift) (below 1: 0) and the same inverse-CDF draw as the torch ops
        (the executor passes kernels/cpu/ops.sample_exp_rows where it runs)."""
        self.sync_free = sync_free
        self.full_row_draw = full_row_draw
        self._weights = Workspace()      # exp weights of the full-vocabulary rows
        self._scratch = Workspace()      # rejection rounds, logprob ranks
        self._scratch2 = Workspace()
        self._raw = Workspace()          # raw logits kept for logprobs when processing overwrites them

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata,
                 grammar: GrammarMask | None = None) -> SamplerOutput:
        """grammar: the structured-output rows, already masked by the caller (so logprobs see the mask);
        here only their empty-row fallback runs, after the logit processors."""
        md = metadata
        if logits.dim() != 2 or tuple(logits.shape) != (md.num_rows, md.vocab_size):
            raise ValueError(f"logits must have shape ({md.num_rows}, {md.vocab_size}), got {tuple(logits.shape)}")
        logits = logits.float().contiguous()
        sync_free = logits.is_cuda if self.sync_free is None else self.sync_free
        raw = None
        if md.logprob_rows_tensor is not None:
            raw = self._raw_logits(logits, md)
        apply_logits_processors(logits, md)
        if grammar is not None:
            grammar.restore_empty_rows(logits)
        block_max = block_reduce(logits, torch.amax)

        if md.all_greedy:
            sampled = argmax_rows(logits, block_max, None)
        else:
            sampled = torch.empty(md.num_rows, dtype=torch.int64, device=logits.device)
            if md.greedy_rows is not None:
                sampled[md.greedy_rows] = argmax_rows(logits, block_max, md.greedy_rows)
            if md.top_k_group is not None:
                group = md.top_k_group
                sampled[group.positions] = _sample_top_k(logits, block_max, group)
            if md.full_group is not None:
                group = md.full_group
                sampled[group.positions] = self._sample_full(logits, block_max, group, sync_free)

        logprobs = None
        if raw is not None:
            logprobs = compute_logprobs(raw, sampled[md.logprob_rows_tensor], md.max_num_logprobs,
                                        workspace=self._scratch, block_max=block_max if raw is logits else None)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _raw_logits(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """The rows that want logprobs as the model produced them: a copy unless no step will touch them."""
        if len(md.logprob_rows) == md.num_rows and not md.modifies_logits:
            return logits
        out = self._raw.take(len(md.logprob_rows), md.vocab_size, logits.device)
        return torch.index_select(logits, 0, md.logprob_rows_tensor, out=out)

    def _sample_full(self, logits: torch.Tensor, block_max: torch.Tensor, group: SamplingGroup,
                     sync_free: bool) -> torch.Tensor:
        """Rows without top-k: temperature and min_p as exp weights over the vocabulary, then top-p."""
        n, vocab = group.positions.shape[0], logits.shape[1]
        rows = None if group.covers_batch else group.positions
        row_max = (block_max if rows is None else block_max[rows]).amax(-1)
        inv_t = group.inv_temperature
        log_floor = torch.full_like(inv_t, LOG_WEIGHT_FLOOR)
        if group.min_p is not None:
            log_floor = torch.maximum(log_floor, group.min_p.log())
        if group.top_p is None and not sync_free and self.full_row_draw is not None and not logits.is_cuda:
            # the weights below and sample_rows' draw, in one call (kernels/cpu/ops.sample_exp_rows)
            return self.full_row_draw(logits, rows, inv_t, row_max * inv_t + log_floor,
                                      _uniforms(group, logits.device))
        # The sync-free top-p sorts the weights in whole segments: they sit in a row padded with zeros.
        width = padded_width(vocab) if sync_free and group.top_p is not None else vocab
        padded = self._weights.take(n, width, logits.device)
        weights = padded[:, :vocab]
        if width > vocab:
            padded[:, vocab:].zero_()
        # weight = exp((l - max) / T - floor): >= 1 exactly for the kept tokens; the rest become 0.
        source = logits if rows is None else torch.index_select(logits, 0, rows, out=weights)
        torch.addcmul((-(row_max * inv_t) - log_floor).unsqueeze(1), source, inv_t.unsqueeze(1), out=weights)
        exp_weights(weights, skip_unneeded_passes=not sync_free)

        block_sums = block_reduce(weights, torch.sum)
        uniforms = _uniforms(group, logits.device)
        tokens = sample_rows(weights, uniforms, block_sums)
        if group.top_p is None:
            return tokens
        if sync_free:
            return self._sample_top_p_without_syncs(logits, block_max, rows, group, padded, block_sums, uniforms,
                                                    tokens)

        # Top-p rows: the nucleus usually fits among the few most likely tokens; look there first.
        nucleus = (group.top_p < 1.0).nonzero().squeeze(1)
        nucleus_mass = group.top_p[nucleus].double() * block_sums[nucleus].double().sum(-1)
        all_rows = rows is None and len(nucleus) == n
        _, candidates = topk_rows(logits, block_max, None if all_rows else group.positions[nucleus],
                                  min(NUCLEUS_GUESS, vocab))
        candidate_weights = weights.view(-1)[(nucleus * vocab).unsqueeze(1) + candidates]
        fits = candidate_weights.double().sum(-1) >= nucleus_mass
        inside = fits.nonzero().squeeze(1)
        if len(inside):
            cols = sample_candidates(candidate_weights[inside], nucleus_mass[inside], uniforms[nucleus[inside]])
            tokens[nucleus[inside]] = candidates[inside].gather(1, cols.unsqueeze(1)).squeeze(1)
        outside = (~fits).nonzero().squeeze(1)
        if len(outside):
            flat_rows = nucleus[outside]
            tokens[flat_rows] = self._sample_nucleus_by_rejection(
                weights, flat_rows, nucleus_mass[outside], tokens[flat_rows], group)
        return tokens

    def _sample_top_p_without_syncs(self, logits: torch.Tensor, block_max: torch.Tensor, rows: torch.Tensor | None,
                                    group: SamplingGroup, padded: torch.Tensor, block_sums: torch.Tensor,
                                    uniforms: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Top-p with fixed shapes over every row of the group (engine/sample/nucleus.py): the candidate
        draw where the nucleus fits among the candidates, else one draw above the nucleus floor."""
        vocab = logits.shape[1]
        weights = padded[:, :vocab]
        top_p = group.top_p
        nucleus_mass = torch.where(top_p < 1.0, top_p.double() * block_sums.double().sum(-1), math.inf)
        _, candidates = topk_rows(logits, block_max, rows, min(NUCLEUS_GUESS, vocab))
        candidate_weights = weights.gather(1, candidates)
        fits = candidate_weights.double().sum(-1) >= nucleus_mass
        cols = sample_candidates(candidate_weights, nucleus_mass, uniforms)
        from_candidates = candidates.gather(1, cols.unsqueeze(1)).squeeze(1)
        floor = nucleus_floor(padded, segment_width(vocab), top_p)
        nucleus = torch.mul(weights, weights >= floor.unsqueeze(1),
                            out=self._scratch.take(weights.shape[0], vocab, logits.device))
        from_nucleus = sample_rows(nucleus, uniforms)
        return torch.where(fits, from_candidates, torch.where(top_p < 1.0, from_nucleus, tokens))

    def _sample_nucleus_by_rejection(self, weights: torch.Tensor, rows: torch.Tensor, nucleus_mass: torch.Tensor,
                                     first_draw: torch.Tensor, group: SamplingGroup) -> torch.Tensor:
        """Top-p draws for rows whose nucleus is large, without sorting the vocabulary.

        Each round draws from the row's weights above its pivot (all of them at first: `first_draw`) and
        accepts the token if the mass strictly above it is below nucleus_mass, i.e. it lies in the nucleus.
        A rejected token and all lighter ones lie outside, so the pivot rises to it. Accepted draws follow
        the weights restricted to the nucleus, since every round's proposal covers the nucleus and changes
        only on rejection. Each rejection removes at least one token, so the loop ends; the expected number
        of rounds grows like log(1/top_p).
        """
        device, vocab = weights.device, weights.shape[1]
        rows_np = rows.cpu().numpy()
        tokens = first_draw.clone()
        drawn = first_draw
        active = torch.arange(len(rows), device=device)
        inv_pivot = torch.ones(len(rows), dtype=torch.float32, device=device)
        attempt = 0
        while True:
            n = len(active)
            if attempt == 0 and n == weights.shape[0]:      # every row, in order: read them in place
                proposal = weights
            else:
                proposal = torch.index_select(weights, 0, rows[active], out=self._scratch.take(n, vocab, device))
            if attempt:
                # Scaled by 1/pivot, every row's pivot becomes the threshold 1 (kept weights are >= 1).
                proposal.mul_(inv_pivot[active].unsqueeze(1))
                F.threshold_(proposal, 1.0, 0.0)
                uniforms = group.random.uniforms(rows_np[active.cpu().numpy()], attempt)
                drawn = sample_rows(proposal, to_device(uniforms, device))
            drawn_weight = proposal.gather(1, drawn.unsqueeze(1))
            heavier = torch.gt(proposal, drawn_weight, out=self._scratch2.take(n, vocab, device))
            mass_above = heavier.mul_(proposal).sum(-1).double() / inv_pivot[active].double()
            accept = mass_above < nucleus_mass[active]
            tokens[active[accept]] = drawn[accept]
            if accept.all():
                return tokens
            rejected = (~accept).nonzero().squeeze(1)
            inv_pivot[active[rejected]] = 1.0 / weights[rows[active[rejected]], drawn[rejected]]
            active = active[rejected]
            attempt += 1


def exp_weights(log_weights: torch.Tensor, skip_unneeded_passes: bool) -> torch.Tensor:
    """In place: exp of the log weights, with every weight below 1 (a token under its floor) set to 0.

    On the CPU one read of the minimum (a host sync) usually saves the clamp and threshold passes, as
    usually no token falls below its floor without min_p; on a GPU both passes are cheaper than the sync
    (review F4). Both ways give the same weights."""
    lowest = log_weights.amin().item() if skip_unneeded_passes else -math.inf
    if lowest < -87.0:
        log_weights.clamp_min_(-87.0)          # exp is many times slower where it would underflow
    log_weights.exp_()
    if lowest < 0.0:
        F.threshold_(log_weights, _BELOW_ONE, 0.0)
    return log_weights


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Steps 1-3 of the module docstring, in place on logits [S, V] (contiguous float32)."""
    flat = logits.view(-1)
    if md.allowed_rows is not None:
        allowed = flat[md.allowed_index]
        logits.index_fill_(0, md.allowed_rows, float("-inf"))
        flat[md.allowed_index] = allowed
    if md.min_tokens_index is not None:
        flat[md.min_tokens_index] = float("-inf")
    if md.bias_index is not None:
        flat.index_add_(0, md.bias_index, md.bias_values)
    if md.penalties is not None:
        _apply_penalties(flat, md.penalties)


def _apply_penalties(flat_logits: torch.Tensor, penalties: PenaltyTensors) -> None:
    """On the seen (row, token) pairs only; each pair appears once, so the write-back is deterministic."""
    values = flat_logits[penalties.index]
    if penalties.repetition is not None:
        values = torch.where(values > 0, values / penalties.repetition, values * penalties.repetition)
    if penalties.frequency is not None:
        values -= penalties.frequency * penalties.output_counts
    if penalties.presence is not None:
        values -= penalties.presence * (penalties.output_counts > 0)
    flat_logits[penalties.index] = values


def _sample_top_k(logits: torch.Tensor, block_max: torch.Tensor, group: SamplingGroup) -> torch.Tensor:
    """Rows with top-k: everything after the top-k candidates works on [n, max_top_k]."""
    rows = None if group.covers_batch else group.positions
    values, token_ids = topk_rows(logits, block_max, rows, group.max_top_k)
    # Weights relative to the top token: 1 for it, the probability ratio for the others.
    weights = ((values - values[:, :1]) * group.inv_temperature.unsqueeze(1)).exp_()
    weights.nan_to_num_(nan=0.0)                # rows whose candidates are all -inf
    if group.min_p is not None:
        weights.masked_fill_(weights < group.min_p.unsqueeze(1), 0.0)
    columns = torch.arange(group.max_top_k, device=logits.device)
    weights.masked_fill_(columns >= group.top_k.unsqueeze(1), 0.0)
    nucleus_mass = None
    if group.top_p is not None:
        total = weights.double().sum(-1)
        nucleus_mass = torch.where(group.top_p < 1.0, group.top_p.double() * total, math.inf)
    cols = sample_candidates(weights, nucleus_mass, _uniforms(group, logits.device))
    return token_ids.gather(1, cols.unsqueeze(1)).squeeze(1)


def _uniforms(group: SamplingGroup, device: torch.device) -> torch.Tensor:
    """The group's first-attempt uniform numbers, one per row."""
    return to_device(group.random.uniforms(), device)
