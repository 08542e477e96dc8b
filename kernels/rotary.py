"""Rotary position embedding (neox style: the two halves of each head rotate together).

`rope_cos_sin_cache` builds one float32 table [max_positions, head_dim] holding cos in the first half and
sin in the second, with llama3 frequency scaling when the config asks for it; `rotary_embedding_torch`
(the reference, the CPU path) applies it to query and key as Hugging Face's models do.
"""

from __future__ import annotations

import math

import torch

from kernels.cpu import ops as cpu_ops


def rope_inv_freq(head_dim: int, base: float, scaling: dict | None = None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_len / low_freq_factor
        high_freq_wavelen = old_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, llama3)")


def rope_cos_sin_cache(
    head_dim: int, max_positions: int, base: float, scaling: dict | None = None
) -> torch.Tensor:
    """float32 [max_positions, head_dim]: cos(pos * f) in the first half, sin(pos * f) in the second."""
    inv_freq = rope_inv_freq(head_dim, base, scaling)
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def rotary_embedding_torch(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """query [T, Hq, D], key [T, Hk, D], positions [T] -> rotated (query, key), new tensors."""
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions.long())
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:]
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def rope_rows(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The positions' rotation factors, looked up once per step for every layer: [2, T, 1, D] holding
    (cos, cos) and (-sin, sin) over the two halves, so that rotate_with_rows is two products and a sum."""
    half = cos_sin_cache.shape[-1] // 2
    rows = cos_sin_cache.index_select(0, positions.long())
    cos, sin = rows[:, :half], rows[:, half:]
    return torch.stack([torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)])[:, :, None, :]


def rotate_with_rows(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by rope_rows(...) [2, T, 1, D]: the same products and sums as _rotate, in fewer
    operations (the halves are swapped by a flip of a [.., 2, D/2] view); float32 CPU tensors take
    kernels/cpu/ops.rope, the same arithmetic in one pass."""
    if cpu_ops.takes_rope(rows, x):
        return cpu_ops.rope(rows, x)
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    return x * rows[0].to(x.dtype) + swapped * rows[1].to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
