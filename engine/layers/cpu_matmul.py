"""Half-precision matmuls on CPUs, with or without half-precision matmul instructions.

On x86 CPUs without a native matmul for the model's 16-bit type (AVX2-only CPUs for both; AVX-512 BF16
CPUs such as AMD Zen 4 for float16, which only AVX-512 FP16 / AMX-FP16 speed up), torch's bf16/fp16 GEMMs run
4-7x slower than fp32 ones for more than one row. There, every matmul layer keeps an exact float32 copy of
its weight, multiplies in float32 and rounds the result back to the model dtype: the arithmetic of a
half-precision GEMM with float32 accumulation (what GPUs and oneDNN's native kernels do), at fp32 speed,
for twice the weight memory. Where the CPU does have the native instruction for the dtype (AVX-512 BF16 or
AMX for bf16), large inputs go to torch's own 16-bit matmul instead (oneDNN: about twice the float32 rate,
the activations rounded to the weights' dtype as a GPU would), and no float32 copy is made.

Up to `GEMM16_MAX_ROWS` rows (decode batches), where the step is bound by reading the weights, the 16-bit
weights themselves are multiplied by kernels/cpu/ops (AVX2, widened in registers, float32 accumulation:
the same arithmetic) when it is available: half the bytes of the fp32 copies, and 2-4x faster than torch's
own bf16 matmul at every batch size up to 16 on this project's AVX2 machine. On AVX-512 BF16 CPUs (Zen 4)
its AVX-512 tiles take up to `GEMM16_MAX_ROWS_AVX512` rows: they beat oneDNN's bf16 matmul and MKL's
float32 one up to about 256-384 rows there, so mixed decode + prefill steps stay on them too.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers import onednn_matmul
from kernels.cpu import ops as cpu_ops

HALF = (torch.bfloat16, torch.float16)
GEMM16_MAX_ROWS = 32
# With the AVX-512 tiles (bf16 by VDPBF16PS, fp16 widened into float32 FMAs) the kernels stay ahead further:
# 30 layers of SmolLM2 on Zen 4, 2 threads, at 64 / 128 / 256 / 384 rows: bf16 42.6 / 80.0 / 150 / 225 ms
# against oneDNN's bf16 matmul 56.9 / 89.9 / 153 / 226 ms; fp16 85 / 173 / 348 ms against MKL on the
# float32 copies 115 / 240 / 399 ms. Past this, prefill chunks go to the library matmuls.
GEMM16_MAX_ROWS_AVX512 = 256


def gemm16_max_rows() -> int:
    """The most rows kernels/cpu/ops's gemm16 takes here (more go to torch's matmul)."""
    return GEMM16_MAX_ROWS_AVX512 if cpu_ops.bf16_dot_enabled() else GEMM16_MAX_ROWS


# the /proc/cpuinfo flags that give torch (oneDNN) a fast matmul for each 16-bit type
NATIVE_MATMUL_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


def cpu_has_native_half_matmul(dtype: torch.dtype) -> bool:
    """Whether torch's own matmul in `dtype` runs at speed here (an instruction for it); True where the CPU
    cannot be asked (not Linux/x86: leave torch's choice alone)."""
    flags = cpu_ops.cpu_flags()
    if flags is None:
        return True
    return any(flag in flags for flag in NATIVE_MATMUL_FLAGS.get(dtype, ()))


def keeps_float32_copies(dtype: torch.dtype) -> bool:
    """Whether an upcast layer of `dtype` multiplies large inputs with a float32 weight copy (no native
    matmul for the dtype, or RINGSERVE_CPU_UPCAST_MATMUL=1 asking for it) rather than torch's own."""
    return os.environ.get("RINGSERVE_CPU_UPCAST_MATMUL") == "1" or not cpu_has_native_half_matmul(dtype)


def should_upcast(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a 16-bit model on `device` takes this module's path (float32 activations, kernels/cpu/ops for
    small inputs, float32 copies or the native 16-bit matmul for large ones) rather than plain torch in the
    model dtype: on a CPU without a native matmul for the dtype, or with one where the AVX2 kernels run
    (they beat it on decode batches). RINGSERVE_CPU_UPCAST_MATMUL=1/0 forces the choice."""
    if device.type != "cpu" or dtype not in HALF:
        return False
    override = os.environ.get("RINGSERVE_CPU_UPCAST_MATMUL")
    if override is not None:
        return override == "1"
    return not cpu_has_native_half_matmul(dtype) or cpu_ops.available()


class UpcastMatmul:
    """Mixed into matmul layers: once `upcast()` ran, `self.matmul(x)` takes kernels/cpu/ops up to
    gemm16_max_rows() rows, and from `upcast_min_rows` rows the fp32 copies (or, where the CPU multiplies the
    dtype natively, torch's 16-bit matmul); a single row without the kernels (a batch-1 decode) is a
    matrix-vector product bound by memory, where reading the half-size weights wins (measured on AVX2: the
    151,936 x 256 LM head takes 6 ms per row in bf16 vs 16 ms in fp32, and 38 vs 37 ms at 8 rows; small
    layers cross at 2 rows)."""

    upcast_done = False
    compute_weight: torch.Tensor | None = None      # the fp32 copy; None where the 16-bit matmul is native
    compute_bias: torch.Tensor | None = None
    upcast_min_rows = 2
    gemm16 = False                  # set by upcast() where kernels/cpu/ops runs
    onednn_weight: torch.Tensor | None = None   # float32 weights packed for oneDNN (engine/layers/onednn_matmul.py)
    qweight = None                  # a quantized weight in place of `weight` (engine/layers/quantized.py)
    # Quantized, this path hands its activations to the CPU kernels in two 8-bit planes (~15 bits; see
    # kernels/cpu/quant.gemm_q): it runs prefill chunks, mixed steps and the LM head, whose rounding decides
    # the first token and every sampled one. One plane (8 bits, as llama.cpp's Q8 activations) made SmolLM2
    # Q4_1 agree with its dequantized self on the top token at 96.1 % of a text's positions and turned its
    # README answer "The capital of France is Paris." into llama.cpp's own "L'Étoile, la Marseillaise, ...";
    # two planes: 99.8 %, and the same answer. The fused decode step (engine/models/cpu_decode.py) keeps one
    # plane, where the layers' matmuls are the step's time.
    precise_activations = True

    def upcast(self) -> None:
        self.upcast_done = True
        if self.qweight is not None:        # quantized matmuls take float32 activations as they are
            return
        self.gemm16 = cpu_ops.available() and self.weight.is_contiguous()
        if not keeps_float32_copies(self.weight.dtype):
            return
        self.compute_weight = self.weight.detach().float()
        bias = getattr(self, "bias", None)
        self.compute_bias = None if bias is None else bias.detach().float()

    def _route(self, rows: int) -> str | None:
        """How the upcast path multiplies `rows` rows: "gemm16" (the kernels), "copy" (the float32 copy),
        "native" (torch's 16-bit matmul), or None (not upcast, or too few rows for either matmul)."""
        if not self.upcast_done:
            return None
        if self.gemm16 and rows <= gemm16_max_rows():
            return "gemm16"
        if rows < self.upcast_min_rows:
            return None
        return "native" if self.compute_weight is None else "copy"

    def matmul_float(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor | None:
        """x @ Wᵀ (+ b) in float32 on the upcast path (or x's dtype on a GPU for a quantized weight); None
        where the layer was not upcast and is not quantized."""
        if self.qweight is not None:
            y = self.qweight.matmul(x, precise=self.precise_activations)
            bias = getattr(self, "bias", None) if with_bias else None
            return y if bias is None else y.add_(bias)
        route = self._route(x.shape[0])
        if route == "copy":
            return F.linear(x.float(), self.compute_weight, self.compute_bias if with_bias else None)
        bias = getattr(self, "bias", None) if with_bias else None
        if route == "gemm16":
            y = cpu_ops.gemm16(x, self.weight)
            return y if bias is None else y.add_(bias)      # a 16-bit bias widens exactly
        if route == "native":                               # oneDNN, float32 accumulation
            return F.linear(x.to(self.weight.dtype), self.weight, bias).float()
        return None

    def matmul_native16(self, x: torch.Tensor) -> torch.Tensor | None:
        """x @ Wᵀ + b left in the weights' 16-bit dtype where this layer gives x to torch's native 16-bit
        matmul (a large input on a CPU with the dtype's instruction), else None: a caller whose next step
        reads 16 bits anyway (SwiGLU before the down projection) skips widening the product to float32."""
        if self.qweight is not None or self._route(x.shape[0]) != "native":
            return None
        return F.linear(x.to(self.weight.dtype), self.weight, getattr(self, "bias", None))

    def matmul(self, x: torch.Tensor, with_bias: bool = True, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x @ Wᵀ (+ b) in `out_dtype` (default: x's)."""
        if self.onednn_weight is not None:
            y = onednn_matmul.linear(x, self.onednn_weight, self.bias if with_bias else None)
            return y if out_dtype is None else y.to(out_dtype)
        y = self.matmul_float(x, with_bias)
        if y is None:       # activations may be float32 over 16-bit weights (engine/models/llama.py)
            y = F.linear(x.to(self.weight.dtype), self.weight, self.bias if with_bias else None)
        return y.to(out_dtype or x.dtype)


def upcast_matmul_weights(model: nn.Module) -> int:
    """Give every matmul layer of `model` its float32 weight copy; returns how many layers got one."""
    count = 0
    for module in model.modules():
        if isinstance(module, UpcastMatmul):
            module.upcast()
            count += 1
    return count
