"""RMSNorm with an optional fused residual add: the torch reference (the CPU path)."""

from __future__ import annotations

import torch


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """y = weight * x / rms(x), computed in float32 and cast back as Hugging Face's Llama does.

    With `residual`, x + residual is normalised and also returned (the next layer's residual):
    (y, x + residual).
    """
    if residual is not None:
        x = x + residual
        residual = x
    variance = x.float().pow(2).mean(-1, keepdim=True)
    y = weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)
    return y if residual is None else (y, residual)
