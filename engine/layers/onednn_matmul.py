"""float32 matmuls on the CPU through oneDNN, with the weights packed once into its blocked layout.

torch's float32 F.linear calls MKL's sgemm, which on AMD CPUs runs a code path that does not use AVX-512:
on this project's Zen machine, oneDNN's packed float32 matmul (torch.ops.mkldnn, the kernels torch's own
compiler uses after freezing a CPU model) ran a [512, 384] x [384, 1536] product 2.2-2.6x faster than
F.linear, with the same float32 arithmetic (largest difference 1e-4 on unit-variance inputs, summation
order). oneDNN also applies an activation inside the matmul (the encoders' GELU). Where torch was built
without oneDNN, or RINGSERVE_CPU_ONEDNN=0, layers keep F.linear.
"""

from __future__ import annotations

import os

import torch
from torch import nn

# the batch-size hint oneDNN picks its packed layout for; any number of rows multiplies correctly
PACK_ROWS_HINT = 1024


def available() -> bool:
    if os.environ.get("RINGSERVE_CPU_ONEDNN", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] float32 -> oneDNN's packed copy of it."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, activation: str = "none") -> torch.Tensor:
    """x [rows, in] @ Wᵀ + b, then `activation` ("none", or "gelu": the exact, erf GELU)."""
    algorithm = "none" if activation == "gelu" else ""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, activation, [], algorithm)


def pack_float32_matmuls(model: nn.Module) -> int:
    """Give every float32 CPU matmul layer of `model` (engine.layers.cpu_matmul.UpcastMatmul) its packed
    weight; returns how many got one (0 where oneDNN is not available)."""
    from engine.layers.cpu_matmul import UpcastMatmul

    if not available():
        return 0
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, UpcastMatmul) and weight is not None and weight.dtype == torch.float32 \
                and weight.device.type == "cpu" and weight.dim() == 2:
            module.onednn_weight = pack(weight)
            count += 1
    return count


def fused_linear_gelu(layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """gelu(layer(x)) in one oneDNN call where `layer` has a packed weight, else None."""
    packed = getattr(layer, "onednn_weight", None)
    if packed is None:
        return None
    return linear(x, packed, layer.bias, "gelu")
