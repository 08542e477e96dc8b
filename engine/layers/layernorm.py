"""RMSNorm as a module over the kernels' dispatch function (fused residual add included)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.weights import CheckpointWeights, new_parameter
from kernels import rms_norm


class RMSNorm(CheckpointWeights, nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = new_parameter(hidden_size, dtype=dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x), or with `residual`: (norm(x + residual), x + residual)."""
        return rms_norm(x, self.weight, self.eps, residual)
