"""The sampling state of the executor's persistent batch, and the per-step SamplingMetadata it hands out.

Rows are the batch's slots 0..max_num_reqs-1. Everything that depends only on which request sits in which
row (row groups, per-row parameter tensors, logit-bias and allowed-token indices) is built once per batch
change and cached; a step with the same rows rebuilds only what depends on the tokens generated so far:
penalty counts, the min_tokens mask and the output positions that seeded randomness is keyed on.

Seeded rows keep their seeds here; how they draw is described in engine/sampling_metadata.py.

Speculative decoding verifies a request's drafts by sampling at each draft position as if the drafts before
it had been accepted: metadata(rows, offsets, ...) takes a request's row once per position, `offsets` saying
how many drafts precede each, and everything that depends on the history follows: the output position that
seeded randomness and min_tokens read is num_output_tokens + offset, and the penalties count the preceding
drafts as output tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sample.metadata import PenaltyTensors, RowRandomness, SamplingGroup, SamplingMetadata
from engine.sample.speculative import runs
from engine.sample.token_occurrences import TokenOccurrences
from engine.sample.transfer import to_device
from engine.sampling_params import SAMPLING_EPS, SamplingParams


@dataclass(slots=True)
class _BatchLayout:
    """What metadata() caches while the rows and their requests stay the same."""

    base: SamplingMetadata
    top_k_slots: np.ndarray
    full_slots: np.ndarray
    top_k_positions: np.ndarray        # their positions in the step's rows
    full_positions: np.ndarray
    min_tokens_positions: np.ndarray   # one entry per (row, stop id) pair
    min_tokens_tokens: np.ndarray
    min_tokens_slots: np.ndarray
    penalty_positions: np.ndarray
    penalty_slots: np.ndarray


_NEUTRAL = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "presence": 0.0, "frequency": 0.0,
            "repetition": 1.0, "seed": 0, "seeded": False, "num_logprobs": -1, "min_tokens": 0,
            "num_output_tokens": 0, "penalized": False, "has_bias": False, "has_allowed": False,
            "has_stop_ids": False, "active": False}


class SamplingBatch:
    """Per-row sampling parameters and history of the persistent batch (see the module docstring).

    Each step the model runner calls metadata(rows) for the rows it samples, in batch order, then
    Sampler()(logits, metadata), then append_tokens(rows, sampled token ids).
    """

    def __init__(self, max_num_reqs: int, vocab_size: int, device: torch.device, seed: int) -> None:
        if max_num_reqs <= 0 or vocab_size <= 0:
            raise ValueError(f"max_num_reqs ({max_num_reqs}) and vocab_size ({vocab_size}) must be positive")
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.generator = np.random.Generator(np.random.PCG64(seed % 2**64))
        dtypes = {"temperature": np.float32, "top_k": np.int64, "top_p": np.float32, "min_p": np.float32,
                  "presence": np.float32, "frequency": np.float32, "repetition": np.float32, "seed": np.uint64,
                  "seeded": bool, "num_logprobs": np.int32, "min_tokens": np.int64,
                  "num_output_tokens": np.int64, "penalized": bool, "has_bias": bool, "has_allowed": bool,
                  "has_stop_ids": bool, "active": bool}
        self._rows = {name: np.full(max_num_reqs, _NEUTRAL[name], dtype=dtype) for name, dtype in dtypes.items()}
        self.logit_bias: list[tuple[np.ndarray, np.ndarray] | None] = [None] * max_num_reqs
        self.allowed_token_ids: list[np.ndarray | None] = [None] * max_num_reqs
        self.min_tokens_stop_ids: list[np.ndarray | None] = [None] * max_num_reqs
        self.occurrences = TokenOccurrences(max_num_reqs, vocab_size)
        self._version = 0
        self._layout: _BatchLayout | None = None
        self._layout_key: tuple[int, np.ndarray] | None = None

    # ------------------------------------------------------------------ membership
    def add_request(self, row: int, params: SamplingParams, prompt_token_ids: Sequence[int],
                    output_token_ids: Sequence[int], eos_token_ids: Sequence[int]) -> None:
        """Put a request in the empty `row`. params must be resolved (SamplingParams.resolved())."""
        self._check_row(row, active=False)
        if not params.is_resolved:
            raise ValueError("params must be resolved (SamplingParams.resolved()) before add_request")
        vocab = self.vocab_size
        if params.logprobs is not None and params.logprobs > vocab:
            raise ValueError(f"logprobs must be at most the vocabulary size {vocab}, got {params.logprobs}")
        # Validate everything before writing anything, so a refused request leaves the row clean.
        output = self._token_array("output_token_ids", output_token_ids)
        stop_ids = self._token_array("stop_token_ids", list(params.stop_token_ids)
                                     + ([] if params.ignore_eos else list(eos_token_ids)))
        bias_ids = self._token_array("logit_bias", list(params.logit_bias or ()))
        allowed = None
        if params.allowed_token_ids is not None:
            allowed = np.unique(self._token_array("allowed_token_ids", params.allowed_token_ids))
        penalized = (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
                     or params.repetition_penalty != 1.0)
        prompt = self._token_array("prompt_token_ids", prompt_token_ids) if penalized else None

        top_k = params.top_k if params.top_k < vocab else 0
        greedy = params.temperature < SAMPLING_EPS or top_k == 1
        values = {
            "temperature": 0.0 if greedy else params.temperature, "top_k": top_k, "top_p": params.top_p,
            "min_p": params.min_p, "presence": params.presence_penalty, "frequency": params.frequency_penalty,
            "repetition": params.repetition_penalty, "seeded": params.seed is not None,
            "seed": 0 if params.seed is None else params.seed % 2**64,
            "num_logprobs": -1 if params.logprobs is None else params.logprobs,
            "min_tokens": params.min_tokens, "num_output_tokens": len(output), "penalized": penalized,
            "has_bias": len(bias_ids) > 0, "has_allowed": allowed is not None,
            "has_stop_ids": params.min_tokens > 0 and len(stop_ids) > 0, "active": True,
        }
        for name, value in values.items():
            self._rows[name][row] = value
        if values["has_stop_ids"]:
            self.min_tokens_stop_ids[row] = np.unique(stop_ids)
        if values["has_bias"]:
            self.logit_bias[row] = (bias_ids, np.array(list(params.logit_bias.values()), dtype=np.float32))
        self.allowed_token_ids[row] = allowed
        if penalized:
            self.occurrences.add(row, prompt, output)
        self._version += 1

    def remove_request(self, row: int) -> None:
        self._check_row(row, active=True)
        if self._rows["penalized"][row]:
            self.occurrences.clear(row)
        self._reset_row(row)

    def move_request(self, src: int, dst: int) -> None:
        """Move the request in row src to the empty row dst (the runner condenses its batch)."""
        self._check_row(src, active=True)
        self._check_row(dst, active=False)
        for values in self._rows.values():
            values[dst] = values[src]
        for per_row in (self.logit_bias, self.allowed_token_ids, self.min_tokens_stop_ids):
            per_row[dst] = per_row[src]
        if self._rows["penalized"][src]:
            self.occurrences.move(src, dst)
        self._reset_row(src)

    def append_tokens(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        """Record one generated token for each of `rows` (distinct rows), after a step."""
        rows = np.asarray(rows, dtype=np.int64)
        token_ids = np.asarray(token_ids, dtype=np.int64)
        if rows.shape != token_ids.shape:
            raise ValueError(f"rows {rows.shape} and token_ids {token_ids.shape} must have the same shape")
        self._rows["num_output_tokens"][rows] += 1
        penalized = self._rows["penalized"][rows]
        if penalized.any():
            self.occurrences.append(rows[penalized], token_ids[penalized])

    def append_runs(self, rows: np.ndarray, token_ids: np.ndarray, offsets: np.ndarray) -> None:
        """Record several generated tokens per row: token_ids[i] is row rows[i]'s offsets[i]-th new token
        (a request's entries consecutive, offsets 0, 1, ...), after a step that verified drafts."""
        for offset in range(int(offsets.max()) + 1 if len(offsets) else 0):
            at = offsets == offset
            self.append_tokens(rows[at], token_ids[at])

    @property
    def num_reqs(self) -> int:
        return int(self._rows["active"].sum())

    # ------------------------------------------------------------------ per step
    def metadata(self, rows: np.ndarray, offsets: np.ndarray | None = None, step_tokens: np.ndarray | None = None,
                 token_index: np.ndarray | None = None) -> SamplingMetadata:
        """The metadata for sampling `rows` this step, in that order; cheap when the batch is unchanged.

        Speculative decoding: `offsets[i]` drafts precede position i (a row repeats once per position of
        its request), and the drafts before position i are step_tokens[token_index[i] - offsets[i] + 1 :
        token_index[i] + 1] (the step's input ids and the positions whose logits are sampled)."""
        rows = np.asarray(rows, dtype=np.int64)
        key = self._layout_key
        if key is None or key[0] != self._version or not np.array_equal(key[1], rows):
            self._layout = self._build_layout(rows, repeats=offsets is not None)
            self._layout_key = (self._version, rows.copy())
        layout = self._layout
        num_output = self._rows["num_output_tokens"]
        md = layout.base
        changes = {}

        def output_positions(slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
            return num_output[slots] if offsets is None else num_output[slots] + offsets[positions]

        if md.top_k_group is not None:
            changes["top_k_group"] = _with_positions(md.top_k_group, output_positions(layout.top_k_slots,
                                                                                       layout.top_k_positions))
        if md.full_group is not None:
            changes["full_group"] = _with_positions(md.full_group, output_positions(layout.full_slots,
                                                                                     layout.full_positions))
        if len(layout.min_tokens_slots):
            slots = layout.min_tokens_slots
            masked = output_positions(slots, layout.min_tokens_positions) < self._rows["min_tokens"][slots]
            if masked.any():
                index = layout.min_tokens_positions[masked] * self.vocab_size + layout.min_tokens_tokens[masked]
                changes["min_tokens_index"] = self._tensor(index)
        if len(layout.penalty_slots):
            drafts = None
            if offsets is not None and offsets[layout.penalty_positions].any():
                drafts = _preceding_drafts(layout.penalty_positions, offsets, step_tokens, token_index)
            changes["penalties"] = self._penalties(layout, drafts)
        return dataclasses.replace(md, **changes) if changes else md

    # ------------------------------------------------------------------ internals
    def _build_layout(self, slots: np.ndarray, repeats: bool = False) -> _BatchLayout:
        if slots.ndim != 1 or (len(slots) and (slots.min() < 0 or slots.max() >= self.max_num_reqs)):
            raise ValueError(f"rows must be a 1-D array of row numbers in [0, {self.max_num_reqs})")
        if not self._rows["active"][slots].all():
            raise ValueError(f"rows {slots[~self._rows['active'][slots]].tolist()} hold no request")
        if not repeats and len(np.unique(slots)) != len(slots):
            raise ValueError("rows must be distinct")
        rows, vocab = self._rows, self.vocab_size
        num_rows = len(slots)
        greedy = rows["temperature"][slots] == 0.0
        top_k = rows["top_k"][slots] > 0
        greedy_pos = np.flatnonzero(greedy)
        top_k_pos = np.flatnonzero(~greedy & top_k)
        full_pos = np.flatnonzero(~greedy & ~top_k)

        def feature_rows(flag: str, per_row: list) -> tuple[np.ndarray, list]:
            """The positions of the (few) rows that use a feature, and their per-row data."""
            positions = np.flatnonzero(rows[flag][slots])
            return positions, [per_row[slot] for slot in slots[positions].tolist()]

        allowed_pos, allowed = feature_rows("has_allowed", self.allowed_token_ids)
        bias_pos, biases = feature_rows("has_bias", self.logit_bias)
        stop_pos, stop_ids = feature_rows("has_stop_ids", self.min_tokens_stop_ids)
        stop_counts = np.array([len(ids) for ids in stop_ids], dtype=np.int64)
        stop_positions = np.repeat(stop_pos, stop_counts)
        logprob_pos = np.flatnonzero(rows["num_logprobs"][slots] >= 0)
        num_logprobs = rows["num_logprobs"][slots][logprob_pos]
        penalty_pos = np.flatnonzero(rows["penalized"][slots])

        base = SamplingMetadata(
            num_rows=num_rows,
            vocab_size=vocab,
            greedy_rows=self._tensor(greedy_pos) if len(greedy_pos) else None,
            all_greedy=len(greedy_pos) == num_rows,
            top_k_group=self._group(top_k_pos, slots, num_rows, with_top_k=True) if len(top_k_pos) else None,
            full_group=self._group(full_pos, slots, num_rows, with_top_k=False) if len(full_pos) else None,
            allowed_rows=self._tensor(allowed_pos) if allowed else None,
            allowed_index=self._tensor(_flat_index(allowed_pos, allowed, vocab)) if allowed else None,
            min_tokens_index=None,
            bias_index=self._tensor(_flat_index(bias_pos, [t for t, _ in biases], vocab)) if biases else None,
            bias_values=self._tensor(np.concatenate([v for _, v in biases])) if biases else None,
            penalties=None,
            logprob_rows=logprob_pos,
            logprob_rows_tensor=self._tensor(logprob_pos) if len(logprob_pos) else None,
            num_logprobs=num_logprobs,
            max_num_logprobs=int(num_logprobs.max()) if len(num_logprobs) else 0,
        )
        return _BatchLayout(
            base=base,
            top_k_slots=slots[top_k_pos],
            full_slots=slots[full_pos],
            top_k_positions=top_k_pos,
            full_positions=full_pos,
            min_tokens_positions=stop_positions,
            min_tokens_tokens=np.concatenate(stop_ids) if stop_ids else np.zeros(0, np.int64),
            min_tokens_slots=slots[stop_positions],
            penalty_positions=penalty_pos,
            penalty_slots=slots[penalty_pos],
        )

    def _group(self, positions: np.ndarray, slots: np.ndarray, num_rows: int, *, with_top_k: bool) -> SamplingGroup:
        rows = self._rows
        group_slots = slots[positions]
        top_k = rows["top_k"][group_slots]
        top_p = rows["top_p"][group_slots]
        min_p = rows["min_p"][group_slots]
        return SamplingGroup(
            positions=self._tensor(positions),
            covers_batch=len(positions) == num_rows,
            inv_temperature=self._tensor(1.0 / rows["temperature"][group_slots]),
            top_k=self._tensor(top_k) if with_top_k else None,
            max_top_k=int(top_k.max()) if with_top_k else 0,
            top_p=self._tensor(top_p) if (top_p < 1.0).any() else None,
            min_p=self._tensor(min_p) if (min_p > 0.0).any() else None,
            random=RowRandomness(seeds=rows["seed"][group_slots], seeded=rows["seeded"][group_slots],
                                 positions=np.zeros(len(positions), np.int64), generator=self.generator),
        )

    def _penalties(self, layout: _BatchLayout, drafts: tuple[np.ndarray, np.ndarray] | None = None) -> PenaltyTensors:
        """drafts: (index into the penalized positions, token) of draft tokens that count as output too."""
        slots = layout.penalty_slots
        owner, tokens, counts = self.occurrences.gather(slots)
        if drafts is not None:
            # one pair per (position, token): the drafts add to the counts of pairs seen before or make new ones
            vocab = self.vocab_size
            keys, inverse = np.unique(np.concatenate([owner * vocab + tokens, drafts[0] * vocab + drafts[1]]),
                                      return_inverse=True)
            counts = np.bincount(inverse, np.concatenate([counts, np.ones(len(drafts[0]))]),
                                 minlength=len(keys)).astype(np.int64)
            owner, tokens = keys // vocab, keys % vocab
        pair_slots = slots[owner]

        def per_pair(name: str, neutral: float) -> torch.Tensor | None:
            values = self._rows[name][pair_slots]
            return self._tensor(values) if (values != neutral).any() else None

        return PenaltyTensors(
            index=self._tensor(layout.penalty_positions[owner] * self.vocab_size + tokens),
            output_counts=self._tensor(counts.astype(np.float32)),
            repetition=per_pair("repetition", 1.0),
            frequency=per_pair("frequency", 0.0),
            presence=per_pair("presence", 0.0),
        )

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        return to_device(values, self.device)

    def _token_array(self, name: str, token_ids: Sequence[int]) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})")
        return ids

    def _check_row(self, row: int, *, active: bool) -> None:
        if not 0 <= row < self.max_num_reqs:
            raise ValueError(f"row {row} is outside [0, {self.max_num_reqs})")
        if self._rows["active"][row] != active:
            raise ValueError(f"row {row} {'holds no request' if active else 'already holds a request'}")

    def _reset_row(self, row: int) -> None:
        for name, values in self._rows.items():
            values[row] = _NEUTRAL[name]
        self.logit_bias[row] = self.allowed_token_ids[row] = self.min_tokens_stop_ids[row] = None
        self._version += 1


def _with_positions(group: SamplingGroup, positions: np.ndarray) -> SamplingGroup:
    return dataclasses.replace(group, random=dataclasses.replace(group.random, positions=positions))


def _flat_index(positions: np.ndarray, token_ids: list[np.ndarray], vocab_size: int) -> np.ndarray:
    counts = np.array([len(t) for t in token_ids], dtype=np.int64)
    return np.repeat(positions, counts) * vocab_size + np.concatenate(token_ids)


def _preceding_drafts(penalty_positions: np.ndarray, offsets: np.ndarray, step_tokens: np.ndarray,
                      token_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index into penalty_positions, token) for each draft that precedes a penalized position."""
    before = offsets[penalty_positions]
    owner, step = runs(before)
    at = token_index[penalty_positions][owner] - before[owner] + 1 + step
    return owner, step_tokens[at].astype(np.int64)
