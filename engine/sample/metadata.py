"""What the Sampler needs to sample one step: SamplingMetadata, built by SamplingBatch.metadata().

Randomness: each sampled row consumes one uniform number per draw. A seeded row's number is a hash of
(seed, output position, attempt) alone, so its tokens do not depend on its batch neighbours, its row, or a
preemption in between (the request comes back with its generated tokens, hence the same positions).
Unseeded rows draw from one engine-wide generator seeded from EngineConfig.seed, in batch order, so all
tensor-parallel ranks, which run the same steps on the same logits, draw the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def seeded_uniforms(seeds: np.ndarray, positions: np.ndarray, attempt: int = 0) -> np.ndarray:
    """Uniform numbers in (0, 1), one per (seed, position, attempt), by splitmix64 mixing: float64 [n]."""
    key = _mix64(seeds.astype(np.uint64) + _GOLDEN_GAMMA)
    z = _mix64(key + (positions.astype(np.uint64) + np.uint64(1)) * _GOLDEN_GAMMA)
    if attempt:
        z = _mix64(z + np.uint64(attempt) * _GOLDEN_GAMMA)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclass(slots=True)
class RowRandomness:
    """Where a group of sampled rows takes its uniform numbers from."""

    seeds: np.ndarray                  # uint64 [n]
    seeded: np.ndarray                 # bool [n]
    positions: np.ndarray              # int64 [n]: output position of the token being sampled
    generator: np.random.Generator     # the engine-wide one, for unseeded rows

    def uniforms(self, select: np.ndarray | None = None, attempt: int = 0) -> np.ndarray:
        """One number per row (or per row of `select`, indices into the group) for the given attempt."""
        seeded = self.seeded if select is None else self.seeded[select]
        if not seeded.any():
            return self.generator.random(len(seeded))
        seeds = self.seeds if select is None else self.seeds[select]
        positions = self.positions if select is None else self.positions[select]
        out = seeded_uniforms(seeds, positions, attempt)
        unseeded = ~seeded
        out[unseeded] = self.generator.random(int(unseeded.sum()))
        return out


@dataclass(slots=True)
class SamplingGroup:
    """Sampled rows that take the same path: their positions in the step's batch and their parameters."""

    positions: torch.Tensor            # int64 [n]
    covers_batch: bool                 # positions == arange(num_rows): no gathering needed
    inv_temperature: torch.Tensor      # float32 [n]
    top_k: torch.Tensor | None         # int64 [n] (the top-k group) or None (the full-vocabulary group)
    max_top_k: int
    top_p: torch.Tensor | None         # float32 [n]; None when no row of the group uses top-p
    min_p: torch.Tensor | None         # float32 [n]; None when no row of the group uses min-p
    random: RowRandomness


@dataclass(slots=True)
class PenaltyTensors:
    """The (row, token) pairs that penalties touch this step, as flat indices into logits.view(-1)."""

    index: torch.Tensor                # int64 [N]
    output_counts: torch.Tensor        # float32 [N]: how often the row generated the token
    repetition: torch.Tensor | None    # float32 [N]; None when no row uses the penalty
    frequency: torch.Tensor | None
    presence: torch.Tensor | None


@dataclass(slots=True)
class SamplingMetadata:
    """How to sample one step's rows (in the order of `SamplingBatch.metadata(rows)`). Build once per step."""

    num_rows: int
    vocab_size: int
    greedy_rows: torch.Tensor | None   # int64 positions of the argmax rows
    all_greedy: bool
    top_k_group: SamplingGroup | None
    full_group: SamplingGroup | None
    # Logit processing, applied in this order; indices are flat positions in logits.view(-1).
    allowed_rows: torch.Tensor | None  # int64 positions of rows restricted to allowed_token_ids
    allowed_index: torch.Tensor | None
    min_tokens_index: torch.Tensor | None
    bias_index: torch.Tensor | None
    bias_values: torch.Tensor | None
    penalties: PenaltyTensors | None
    # Logprobs: LogprobsTensors rows follow logprob_rows; row j asks for num_logprobs[j] <= max_num_logprobs.
    logprob_rows: np.ndarray           # int64 positions in the batch
    logprob_rows_tensor: torch.Tensor | None
    num_logprobs: np.ndarray           # int32
    max_num_logprobs: int

    @property
    def modifies_logits(self) -> bool:
        return (self.allowed_rows is not None or self.min_tokens_index is not None
                or self.bias_index is not None or self.penalties is not None)
