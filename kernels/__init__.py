"""Kernels: each operation has a torch reference (the CPU path) and, on CUDA, a Triton kernel.

The functions here dispatch on the tensor's device: a CUDA tensor goes to the Triton kernel when one is
available (set RINGSERVE_KERNELS=torch to force the references), anything else to the reference, except
RMSNorm and SiLU-and-mul on the CPU tensors of 16-bit models (float32 activations, 16-bit weights; a bf16
SwiGLU gate where AVX-512 BF16 makes bf16 native), which go to kernels/cpu/ops's one-pass versions. The
signatures of each pair are identical; tests compare them over grids of shapes. The Triton modules
(kernels/triton_*.py) are imported only when a CUDA tensor first arrives, so CPU runs never import triton.

Quantized weights (kernels/gguf_blocks.QuantizedWeight, a GGUF file's blocks): `prepare_quantized` gives
the form each device multiplies, kernels/cpu/quant's C kernels on the CPU, the Triton dequantize-in-the-GEMM
kernel on CUDA, the torch reference (dequantize, then matmul) elsewhere.
"""

from __future__ import annotations

import os

from kernels.cpu import ops as cpu_ops
from kernels.cpu import quant as cpu_quant
from kernels.activation import silu_and_mul_torch
from kernels.gguf_blocks import QuantizedWeight
from kernels.kv_cache import write_kv_cache_torch
from kernels.paged_attention import paged_attention_torch, paged_decode_attention_torch
from kernels.rms_norm import rms_norm_torch
from kernels.rotary import rope_cos_sin_cache, rotary_embedding_torch

__all__ = [
    "paged_attention",
    "paged_attention_torch",
    "paged_decode_attention",
    "paged_decode_attention_torch",
    "QuantizedWeight",
    "prepare_quantized",
    "rms_norm",
    "rms_norm_torch",
    "rope_cos_sin_cache",
    "rotary_embedding",
    "rotary_embedding_torch",
    "silu_and_mul",
    "silu_and_mul_torch",
    "use_triton",
    "write_kv_cache",
    "write_kv_cache_torch",
]


def use_triton(tensor) -> bool:
    """Whether operations on `tensor` go to the Triton kernels."""
    return tensor.is_cuda and os.environ.get("RINGSERVE_KERNELS", "auto") != "torch" and _triton_ok()


_TRITON_OK: bool | None = None


def _triton_ok() -> bool:
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            import triton  # noqa: F401

            _TRITON_OK = True
        except ImportError:
            _TRITON_OK = False
    return _TRITON_OK


def rms_norm(x, weight, eps: float, residual=None):
    if use_triton(x):
        from kernels.triton_rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    if not x.is_cuda and cpu_ops.takes_rms_norm(x, weight, residual):
        return cpu_ops.rms_norm(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


def silu_and_mul(x):
    if use_triton(x):
        from kernels.triton_activation import silu_and_mul_triton

        return silu_and_mul_triton(x)
    if not x.is_cuda and cpu_ops.takes_silu_and_mul(x):
        return cpu_ops.silu_and_mul(x)
    return silu_and_mul_torch(x)


def rotary_embedding(positions, query, key, cos_sin_cache):
    if use_triton(query):
        from kernels.triton_rotary import rotary_embedding_triton

        return rotary_embedding_triton(positions, query, key, cos_sin_cache)
    return rotary_embedding_torch(positions, query, key, cos_sin_cache)


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    if use_triton(key):
        from kernels.triton_kv_cache import write_kv_cache_triton

        write_kv_cache_triton(key, value, key_cache, value_cache, slot_mapping)
    else:
        write_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, scale: float,
                    out=None):
    if use_triton(query):
        from kernels.triton_paged_attention import paged_attention_triton

        return paged_attention_triton(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                                      scale, out)
    return paged_attention_torch(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                                 scale, out)


def paged_decode_attention(query, key_cache, value_cache, seq_lens, block_tables, scale: float):
    if use_triton(query):
        from kernels.triton_decode_attention import paged_decode_attention_triton

        return paged_decode_attention_triton(query, key_cache, value_cache, seq_lens, block_tables, scale)
    return paged_decode_attention_torch(query, key_cache, value_cache, seq_lens, block_tables, scale)



def prepare_quantized(weight: QuantizedWeight, device):
    """The form of a QuantizedWeight that the kernels multiply on `device`: repacked for the C kernels on a
    CPU that runs them, packed for the Triton kernel on CUDA, else the weight itself (the torch reference).
    Each has .matmul(x) (float32 on the CPU, x's dtype on CUDA) and .rows(ids) (float32 embedding rows)."""
    if device.type == "cuda" and _triton_ok() and os.environ.get("RINGSERVE_KERNELS", "auto") != "torch":
        from kernels.triton_quant_matmul import TritonQuantWeight

        return TritonQuantWeight(weight, device)
    if device.type == "cpu" and cpu_quant.available():
        return cpu_quant.PackedWeight(weight)
    return weight
