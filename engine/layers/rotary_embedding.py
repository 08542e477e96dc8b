"""Rotary position embedding as a module: one cos/sin table, built once, applied through the kernels."""

from __future__ import annotations

import torch
from torch import nn

from kernels import rope_cos_sin_cache, rotary_embedding
from kernels.rotary import rope_rows, rotate_with_rows


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, base: float, scaling: dict | None = None):
        super().__init__()
        # float32 [max_positions, head_dim]; not a checkpoint weight (HF's inv_freq is ignored on load).
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_cache(head_dim, max_positions, base, scaling), persistent=False
        )

    def prepare(self, positions: torch.Tensor) -> torch.Tensor:
        """What the step's layers pass to forward(): the positions themselves on CUDA (the Triton kernel reads
        the table), on the CPU their rotation factors (kernels.rotary.rope_rows), built once per step
        instead of once per layer."""
        if positions.is_cuda:
            return positions
        return rope_rows(self.cos_sin_cache, positions)

    def forward(
        self, prepared: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """prepared (from prepare(positions [T])); query [T, Hq, D], key [T, Hk, D] -> rotated (query, key)."""
        if query.is_cuda:
            return rotary_embedding(prepared, query, key, self.cos_sin_cache)
        return rotate_with_rows(prepared, query), rotate_with_rows(prepared, key)

    def rotate(self, prepared: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """CPU only: one tensor of heads [T, H, D] (e.g. q and k side by side) rotated in one pass."""
        return rotate_with_rows(prepared, x)
