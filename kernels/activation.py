"""SiLU-and-mul (the SwiGLU gate): the torch reference (the CPU path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] along the last dimension -> silu(gate) * up."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
