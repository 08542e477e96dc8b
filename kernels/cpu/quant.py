"""CPU kernels for GGUF-quantized weights (kernels/cpu/quant.c, in kernels/cpu/ops's library): `pack`
regroups a QuantizedWeight's blocks into tiles of 16 rows once, at load (the same bits, in the order the
kernels read; see quant.c), `gemm_q` multiplies float32 activations by such a PackedWeight (8-bit
activations per block of 32, integer dot products, float32 scales), `PackedWeight.rows` reads rows of one
(a quantized token embedding).

Why: a batch-1 decode step reads every weight once, so its time follows the weights' bytes (Q4_1 is 0.63
bytes a value against 2 for fp16), and at many rows integer products (VPMADDUBSW on AVX2, VPDPBUSD with
AVX-512 VNNI) do four to eight times the float32 FMA's work per instruction. The error against the float
matmul of the same blocks is that of rounding each activation to 8 bits per block of 32 values, as
llama.cpp's Q8_0 activations do; tests/kernels/cpu/test_quant.py bounds it.

AVX-512 VNNI CPUs (Zen 4, Ice Lake on) take 16 rows an instruction; `set_vnni(False)` pins the AVX2 path
(tests run both), as does RINGSERVE_CPU_VNNI=0. Only call these when available().
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from kernels.cpu import ops as cpu_ops
from kernels.gguf_blocks import QuantizedWeight, bytes_by_type

VNNI_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")


@functools.cache
def _lib() -> ctypes.CDLL | None:
    lib = cpu_ops._library()
    if lib is None:
        return None
    ptr, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.matmul_weight.restype = None
    lib.matmul_weight.argtypes = [ctypes.POINTER(cpu_ops.Weight), ptr, ptr, i64, i64, cint, cint]
    lib.packed_bytes.restype = i64
    lib.packed_bytes.argtypes = [cint, i64, i64]
    lib.repack_q.restype = None
    lib.repack_q.argtypes = [cint, ptr, i64, i64, ptr, cint]
    lib.dequantize_packed_rows.restype = None
    lib.dequantize_packed_rows.argtypes = [ptr, cint, ptr, i64, i64, ptr]
    lib.set_quant_vnni.restype = cint
    lib.set_quant_vnni.argtypes = [cint]
    lib.set_quant_vnni(int(vnni_possible() and os.environ.get("RINGSERVE_CPU_VNNI", "1") != "0"))
    return lib


def available() -> bool:
    """Whether these kernels run here (those of kernels/cpu/ops: x86 AVX2, a C compiler, not disabled)."""
    return _lib() is not None


def vnni_possible() -> bool:
    """Whether this CPU has AVX-512 VNNI (with BW and VL), which the 16-row vector kernels need."""
    return all(flag in (cpu_ops.cpu_flags() or ()) for flag in VNNI_CPU_FLAGS)


def set_vnni(on: bool) -> bool:
    """Turn the AVX-512 VNNI kernels on or off; returns whether they were on. On needs vnni_possible()."""
    if on and not vnni_possible():
        raise RuntimeError("this CPU has no AVX-512 VNNI")
    return bool(_lib().set_quant_vnni(int(on)))


class PackedWeight:
    """A QuantizedWeight's parts repacked for the CPU kernels (uint8 tensors of packed_bytes each); the
    file's blocks are not kept."""

    def __init__(self, weight: QuantizedWeight):
        lib = _lib()
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.parts: list[tuple[int, int, torch.Tensor]] = []           # (type id, rows, packed bytes)
        for type_id, raw in weight.parts:
            raw = raw.cpu().contiguous()
            rows = raw.shape[0]
            packed = torch.empty(lib.packed_bytes(type_id, rows, self.in_features), dtype=torch.uint8)
            lib.repack_q(type_id, raw.data_ptr(), rows, self.in_features, packed.data_ptr(), torch.get_num_threads())
            self.parts.append((type_id, rows, packed))
        self.descriptor = cpu_ops.Weight(num_parts=len(self.parts))
        for i, (type_id, rows, packed) in enumerate(self.parts):
            self.descriptor.data[i], self.descriptor.rows[i], self.descriptor.type[i] = packed.data_ptr(), rows, type_id

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        return sum(packed.numel() for _, _, packed in self.parts)

    def bytes_by_type(self) -> dict[str, int]:
        return bytes_by_type((type_id, packed.numel()) for type_id, _, packed in self.parts)

    def matmul(self, x: torch.Tensor, precise: bool = False) -> torch.Tensor:
        return gemm_q(x, self, precise=precise)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [n], in range) dequantized: float32 [n, in_features]; a one-part weight."""
        if len(self.parts) != 1:
            raise ValueError("rows() reads a one-part weight (a token embedding)")
        type_id, _, packed = self.parts[0]
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.shape[0], self.in_features, dtype=torch.float32)
        _lib().dequantize_packed_rows(packed.data_ptr(), type_id, ids.data_ptr(), ids.shape[0], self.in_features,
                                      out.data_ptr())
        return out


def gemm_q(x: torch.Tensor, weight: PackedWeight, out: torch.Tensor | None = None, precise: bool = False
           ) -> torch.Tensor:
    """x [M, K] (any float dtype) @ weightᵀ -> float32 [M, N]. precise: activations in two 8-bit planes (the
    rounding error quantized again: ~15 bits, twice the integer work), for the LM head."""
    if x.dim() != 2 or x.shape[1] != weight.in_features:
        raise ValueError(f"gemm_q: x {tuple(x.shape)} against a weight of {weight.in_features} inputs")
    x = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
    if out is None:
        out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    _lib().matmul_weight(ctypes.byref(weight.descriptor), x.data_ptr(), out.data_ptr(), x.shape[0],
                         weight.in_features, int(precise), torch.get_num_threads())
    return out
