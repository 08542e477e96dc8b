"""Half-precision matmuls on CPUs that have no half-precision matmul instructions.

On x86 CPUs without AVX-512 BF16 or AMX (e.g. this project's AVX2 CI machines), torch's bf16/fp16 GEMMs
run 4–7x slower than fp32 ones for more than one row. There, every matmul layer keeps an exact float32 copy
of its weight, multiplies in float32 and rounds the result back to the model dtype: the arithmetic of a
half-precision GEMM with float32 accumulation (what GPUs and oneDNN's native kernels do), at fp32 speed,
for twice the weight memory. Activations, the KV cache and everything else stay in the model dtype.

Up to `GEMM16_MAX_ROWS` rows (decode batches), where the step is bound by reading the weights, the 16-bit
weights themselves are multiplied by kernels/cpu_avx2 (AVX2, widened in registers, float32 accumulation:
the same arithmetic) when it is available: half the bytes of the fp32 copies, and 2-4x faster than torch's
own bf16 matmul at every batch size up to 16 on this project's AVX2 machine.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from kernels import cpu_avx2

HALF = (torch.bfloat16, torch.float16)
GEMM16_MAX_ROWS = 32


@functools.cache
def cpu_has_native_half_matmul() -> bool:
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True                       # not Linux/x86: leave torch's choice alone
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16", "avx512_fp16"))


def should_upcast(device: torch.device, dtype: torch.dtype) -> bool:
    override = os.environ.get("RINGSERVE_CPU_UPCAST_MATMUL")
    if override is not None:
        return override == "1" and device.type == "cpu" and dtype in HALF
    return device.type == "cpu" and dtype in HALF and not cpu_has_native_half_matmul()


class UpcastMatmul:
    """Mixed into matmul layers: `self.matmul(x)` uses the fp32 copies once `upcast()` ran, for inputs of
    at least `upcast_min_rows` rows; a single row (a batch-1 decode) is a matrix-vector product that is
    bound by memory, where reading the half-size weights wins (measured on AVX2: the 151,936 x 256 LM head
    takes 6 ms per row in bf16 vs 16 ms in fp32, and 38 vs 37 ms at 8 rows; small layers cross at 2 rows)."""

    compute_weight: torch.Tensor | None = None
    compute_bias: torch.Tensor | None = None
    upcast_min_rows = 2
    gemm16 = False                  # set by upcast() where kernels/cpu_avx2 runs

    def upcast(self) -> None:
        self.compute_weight = self.weight.detach().float()
        bias = getattr(self, "bias", None)
        self.compute_bias = None if bias is None else bias.detach().float()
        self.gemm16 = cpu_avx2.available() and self.weight.is_contiguous()

    def matmul_float(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor | None:
        """x @ Wᵀ (+ b) in float32 on the upcast path; None where the layer was not upcast."""
        weight = self.compute_weight
        if weight is None:
            return None
        bias = self.compute_bias if with_bias else None
        if self.gemm16 and x.shape[0] <= GEMM16_MAX_ROWS:
            y = cpu_avx2.gemm16(x, self.weight)
            return y if bias is None else y.add_(bias)
        if x.shape[0] < self.upcast_min_rows:
            return None
        return F.linear(x.float(), weight, bias)

    def matmul(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        y = self.matmul_float(x, with_bias)
        if y is None:       # activations may be float32 over 16-bit weights (engine/models/llama.py)
            y = F.linear(x.to(self.weight.dtype), self.weight, self.bias if with_bias else None)
        return y.to(x.dtype)


def upcast_matmul_weights(model: nn.Module) -> int:
    """Give every matmul layer of `model` its float32 weight copy; returns how many layers got one."""
    count = 0
    for module in model.modules():
        if isinstance(module, UpcastMatmul):
            module.upcast()
            count += 1
    return count
