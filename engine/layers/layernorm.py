"""RMSNorm as a module over the kernels' dispatch function (fused residual add included), and LayerNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


class LayerNorm(CheckpointWeights, nn.Module):
    """LayerNorm with weight and bias (the encoders' post-norm), computed in the input's dtype: 16-bit
    weights widen to float32 activations here, where the residual stream is float32."""

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = new_parameter(hidden_size, dtype=dtype)
        self.bias = new_parameter(hidden_size, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if weight.dtype != x.dtype:
            weight, bias = weight.to(x.dtype), bias.to(x.dtype)
        return F.layer_norm(x, weight.shape, weight, bias, self.eps)
