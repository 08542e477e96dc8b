"""Rotary position embedding as a module: one cos/sin table, built once, applied through the kernels."""

from __future__ import annotations

import torch
from torch import nn

from kernels import rope_cos_sin_cache, rotary_embedding


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, base: float, scaling: dict | None = None):
        super().__init__()
        # float32 [max_positions, head_dim]; not a checkpoint weight (HF's inv_freq is ignored on load).
        self.register_buffer(
            "cos_sin_cache", rope_cos_sin_cache(head_dim, max_positions, base, scaling), persistent=False
        )

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; query [T, Hq, D], key [T, Hk, D] -> rotated (query, key)."""
        return rotary_embedding(positions, query, key, self.cos_sin_cache)
