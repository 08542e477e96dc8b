"""The CPU kernels' ctypes face (the C in this package, built by kernels/cpu/build.py): `gemm16` (16-bit
weights times float32 activations), `paged_decode_attention16` / `paged_attention16` (decode and prefill
attention read in place from the paged 16-bit KV cache), `DecodeStack` (a whole decode step of a
Llama-family model in one call, several query tokens a request when drafts are verified), one-pass
RMSNorm, SiLU-and-mul and RoPE, and `sample_exp_rows` (the sampler's one-pass draw of rows without
top-k/top-p). kernels/cpu/quant.py is the face of the quantized-weight kernels in the same library.

Why: on x86 CPUs without AVX-512 BF16/AMX, torch's bf16 and fp16 matmuls widen the weights slowly and reach
~8 GB/s, below its own fp32 path, while a decode step at small batch is bound by reading the weights; and
its decode attention gathers the paged K and V into new tensors before SDPA. These kernels read each 16-bit
weight and each cached key once and widen them in registers (float32 arithmetic throughout, as a GPU's
half-precision kernels), with AVX2 paths everywhere and AVX-512 BF16 dot products where the CPU has them.
They are accelerators, never requirements: with no compiler, another CPU, or RINGSERVE_CPU_KERNELS=0,
`available()` is False and callers use the torch paths. Each has a test against the torch reference
(tests/kernels/cpu/test_ops.py).
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from kernels.cpu import build
from kernels.cpu.build import cpu_flags

BF16_DOT_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")    # VDPBF16PS (e.g. AMD Zen 4)
SUPPORTED = (torch.bfloat16, torch.float16)
MAX_GROUP, MAX_HEAD_DIM = 16, 256          # as in attention.c
_bf16_dot = False                          # the library's AVX-512 switch (set_bf16_dot), mirrored here


def _has_flags(wanted: tuple[str, ...]) -> bool:
    return all(flag in (cpu_flags() or ()) for flag in wanted)


class Weight(ctypes.Structure):
    """kernels.h's Weight: one 16-bit matrix, or GGUF-quantized parts stacked by output rows."""
    _fields_ = [("data", ctypes.c_void_p * 4), ("rows", ctypes.c_int64 * 4), ("type", ctypes.c_int32 * 4),
                ("num_parts", ctypes.c_int32)]


GGML_F16, GGML_BF16 = 1, 30
MATMULS = ("qkv", "o_proj", "gate_up", "down")


def weight_descriptor(weight) -> Weight:
    """The C Weight of a contiguous 16-bit CPU matrix, or a kernels/cpu/quant.PackedWeight's own (it points
    into the weight: keep the weight alive)."""
    if not isinstance(weight, torch.Tensor):
        return weight.descriptor
    if weight.dtype not in SUPPORTED or not weight.is_contiguous() or weight.device.type != "cpu":
        raise ValueError(f"a matmul weight must be a contiguous bf16/fp16 CPU tensor, got {weight.dtype}")
    return Weight(data=(ctypes.c_void_p * 4)(weight.data_ptr()), rows=(ctypes.c_int64 * 4)(weight.shape[0]),
                  type=(ctypes.c_int32 * 4)(GGML_BF16 if weight.dtype == torch.bfloat16 else GGML_F16), num_parts=1)


class _Layer(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("input_norm", "qkv_bias", "q_norm", "k_norm", "post_norm")),
                *((name, Weight) for name in MATMULS), ("key_cache", ctypes.c_void_p), ("value_cache", ctypes.c_void_p)]


class _Model(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_int64) for name in (
        "num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "intermediate", "block_size")),
        ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("is_bf16", ctypes.c_int),
        ("layers", ctypes.POINTER(_Layer)), ("final_norm", ctypes.c_void_p), ("cos_sin", ctypes.c_void_p)]


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = build.load()
    if lib is None:
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.gemm16.restype = None
    lib.gemm16.argtypes = [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int, ctypes.c_int]
    lib.paged_decode_attention16.restype = None
    lib.paged_decode_attention16.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64,
                                             ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.decode_forward16.restype = None
    lib.decode_forward16.argtypes = [ctypes.POINTER(_Model), ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_int]
    lib.rms_norm_f32.restype = None
    lib.rms_norm_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int, ctypes.c_int]
    lib.rope_f32.restype = None
    lib.rope_f32.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, ctypes.c_int]
    for name in ("silu_and_mul_f32", "silu_and_mul_bf16"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ptr, ptr, i64, i64, ctypes.c_int]
    lib.sample_exp_rows.restype = None
    lib.sample_exp_rows.argtypes = [ptr, i64, ptr, i64, ptr, ptr, ptr, ptr, ctypes.c_int]
    lib.set_bf16_dot.restype = ctypes.c_int
    lib.set_bf16_dot.argtypes = [ctypes.c_int]
    global _bf16_dot
    _bf16_dot = bf16_dot_possible() and os.environ.get("RINGSERVE_CPU_BF16_DOT", "1") != "0"
    lib.set_bf16_dot(int(_bf16_dot))
    return lib


def available() -> bool:
    """Whether these kernels run here (x86 with AVX2/FMA/F16C and a C compiler; not disabled)."""
    return _library() is not None


def bf16_dot_possible() -> bool:
    """Whether this CPU has AVX-512 BF16, with which gemm16 multiplies bf16 weights from three rows on with
    VDPBF16PS (activations rounded to bf16, float32 accumulation: twice the float32 FMA rate) and the decode
    attention scores a bf16 cache against the bf16-rounded query (head_dim % 32 == 0); the library turns
    both on at load unless RINGSERVE_CPU_BF16_DOT=0."""
    return _has_flags(BF16_DOT_CPU_FLAGS)


def _cpu_rows(t: torch.Tensor | None, dtype: torch.dtype) -> bool:
    return t is None or (t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous())


def takes_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether rms_norm() takes these: float32 rows (and residual), a 16-bit weight, all contiguous CPU
    tensors (the eager path of 16-bit models on the CPU), with the kernels available."""
    return (_cpu_rows(x, torch.float32) and _cpu_rows(residual, torch.float32) and weight.dtype in SUPPORTED
            and _cpu_rows(weight, weight.dtype) and weight.dim() == 1 and available())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """kernels.rms_norm_torch where takes_rms_norm(): one pass a row, rows in parallel; the same float32
    arithmetic (sums of squares in another order: a different last bit now and then)."""
    n = weight.shape[0]
    if x.shape[-1] != n or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, residual "
                         f"{None if residual is None else tuple(residual.shape)}, weight ({n},)")
    out = torch.empty_like(x)
    total = None if residual is None else torch.empty_like(x)
    _library().rms_norm_f32(x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
                            out.data_ptr(), 0 if total is None else total.data_ptr(), x.numel() // n, n, eps,
                            int(weight.dtype == torch.bfloat16), torch.get_num_threads())
    return out if residual is None else (out, total)


def takes_silu_and_mul(x: torch.Tensor) -> bool:
    """Whether silu_and_mul() takes x: contiguous float32 CPU rows, or bf16 ones on a CPU with AVX-512 BF16
    (where torch's matmul hands the SwiGLU gate over in bf16), with the kernels available."""
    return ((_cpu_rows(x, torch.float32) or (_cpu_rows(x, torch.bfloat16) and bf16_dot_possible()))
            and x.dim() >= 1 and x.shape[-1] % 2 == 0 and available())


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """kernels.silu_and_mul_torch where takes_silu_and_mul(): one pass, rows in parallel; bf16 rounds where
    torch's bf16 ops round (after the SiLU and after the product)."""
    width = x.shape[-1]
    out = torch.empty(*x.shape[:-1], width // 2, dtype=x.dtype)
    kernel = _library().silu_and_mul_bf16 if x.dtype == torch.bfloat16 else _library().silu_and_mul_f32
    kernel(x.data_ptr(), out.data_ptr(), x.numel() // max(width, 1), width // 2, torch.get_num_threads())
    return out


def takes_rope(factors: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether rope() takes x [T, H, D] (float32 on the CPU, each row's heads contiguous, D % 16 == 0) and
    kernels.rotary.rope_rows' factors [2, T, 1, D] (contiguous float32), with the kernels available."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 3 and x.shape[-1] % 16 == 0
            and x.stride(2) == 1 and x.stride(1) == x.shape[2] and _cpu_rows(factors, torch.float32)
            and factors.shape == (2, x.shape[0], 1, x.shape[2]) and available())


def rope(factors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """kernels.rotary.rotate_with_rows where takes_rope(): one pass, rows in parallel, the same float32
    products and sums; x may be a row slice of a wider tensor (q and k inside the fused qkv output)."""
    num_tokens, heads, dim = x.shape
    out = torch.empty(num_tokens, heads, dim, dtype=torch.float32)
    _library().rope_f32(x.data_ptr(), x.stride(0), factors.data_ptr(), out.data_ptr(), num_tokens, heads, dim,
                        torch.get_num_threads())
    return out


def set_bf16_dot(on: bool) -> bool:
    """Turn the AVX-512 BF16 paths of gemm16 and the attention on or off (tests pin one arithmetic); returns
    whether they were on.
    On needs bf16_dot_possible(). Only call when available()."""
    global _bf16_dot
    if on and not bf16_dot_possible():
        raise RuntimeError("this CPU has no AVX-512 BF16")
    was = bool(_library().set_bf16_dot(int(on)))
    _bf16_dot = bool(on)
    return was


def bf16_dot_enabled() -> bool:
    """Whether gemm16 runs its AVX-512 tiles from three rows on (bf16_dot_possible() and not turned off)."""
    return available() and _bf16_dot


def gemm16(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype) @ weight [N, K]ᵀ (bf16 or fp16, contiguous) -> float32 [M, N]; float32
    arithmetic, except bf16 weights from three rows on where bf16_dot_possible(): bf16 products.

    Only call when available(); x is widened to float32 first (a copy of M x K, small next to the weight).
    """
    lib = _library()
    if weight.dtype not in SUPPORTED or not weight.is_contiguous():
        raise ValueError(f"gemm16 needs a contiguous bf16/fp16 weight, got {weight.dtype}")
    x = _float32(x)
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"gemm16: x has {k} columns, weight has {weight.shape[1]}")
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    lib.gemm16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), m, n, k, int(weight.dtype == torch.bfloat16),
               torch.get_num_threads())
    return out


def sample_exp_rows(logits: torch.Tensor, rows: torch.Tensor | None, inv_temperature: torch.Tensor,
                    shift: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of logits (or of logits[rows]) drawn with weights exp(l * inv_temperature - shift),
    a weight below 1 counting as 0, by inverse CDF with the row's uniform number: int64 [n]. The weights of
    engine/sample/sampler.py's full-vocabulary rows, in one C pass per row (see elementwise.c).

    logits float32 [S, V] contiguous on the CPU; rows int64 [n] or None (n = S); inv_temperature and shift
    float32 [n]; uniforms float64 [n] in [0, 1). Only call when available()."""
    if logits.dtype != torch.float32 or not logits.is_contiguous() or logits.dim() != 2 or logits.is_cuda:
        raise ValueError("sample_exp_rows needs contiguous float32 [S, V] logits on the CPU")
    n = logits.shape[0] if rows is None else rows.shape[0]
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
        if n and (int(rows.min()) < 0 or int(rows.max()) >= logits.shape[0]):
            raise ValueError("sample_exp_rows: a row index is out of range")
    inv_temperature = inv_temperature.to(torch.float32).contiguous()
    shift = shift.to(torch.float32).contiguous()
    uniforms = uniforms.to(torch.float64).contiguous()
    if not inv_temperature.shape == shift.shape == uniforms.shape == (n,):
        raise ValueError(f"sample_exp_rows: inv_temperature, shift and uniforms need shape ({n},)")
    out = torch.empty(n, dtype=torch.int64)
    _library().sample_exp_rows(logits.data_ptr(), logits.shape[1], None if rows is None else rows.data_ptr(), n,
                               inv_temperature.data_ptr(), shift.data_ptr(), uniforms.data_ptr(), out.data_ptr(),
                               torch.get_num_threads())
    return out


def supports_attention(key_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether paged_decode_attention16 handles this cache layout [blocks, block_size, Hk, D] and head count."""
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    return (key_cache.dtype in SUPPORTED and key_cache.is_contiguous() and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads <= MAX_GROUP and head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM)


def paged_decode_attention16(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                             seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,
                             batch_invariant: bool = True) -> torch.Tensor:
    """Same contract as kernels.paged_decode_attention_torch (query [R, Hq, D] -> [R, Hq, D] in query's
    dtype) for a contiguous 16-bit cache that supports_attention() accepts; only call when available().
    batch_invariant: a row's key ranges follow its own length, so it gets the same bits in any batch;
    False splits only small batches (for thousands of prefill rows)."""
    lib = _library()
    num_reqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    q = _float32(query)
    seq_lens = seq_lens.to(torch.int32).contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    out = torch.empty(num_reqs, num_heads, head_dim, dtype=torch.float32)
    lib.paged_decode_attention16(
        q.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), seq_lens.data_ptr(), block_tables.data_ptr(),
        block_tables.shape[1], out.data_ptr(), num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale,
        int(key_cache.dtype == torch.bfloat16), int(batch_invariant), torch.get_num_threads(),
    )
    return out.to(query.dtype)


def paged_attention16(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Same contract as kernels.paged_attention_torch (prefill chunks and decode tokens, causal, query
    [T, Hq, D] -> [T, Hq, D] in query's dtype) for a cache that supports_attention() accepts: each query
    token runs as a decode row of its own causal length, reading the cache in place (2.5-6x the torch
    reference for 256-2,048-token prompts on the project's machine, whose masked SDPA grows quadratically
    in memory). Rows past query_start_loc[-1] (padding) get zeros. Only call when available()."""
    lens, tables = per_token_rows(query_start_loc, seq_lens, block_tables, rows=query.shape[0])
    return paged_decode_attention16(query, key_cache, value_cache, lens, tables, scale, batch_invariant=False)


def per_token_rows(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                   rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_lens int32, block_tables) with one row per query token, so that prefill chunks and verify steps
    run as decode rows: token i of a request with q query tokens and seq_len cached ones (its own included)
    sees seq_len - q + i + 1 of them. `rows` pads both with zeros past the actual tokens. (The executor's
    numpy twin for its staging buffers: StepInputs.token_rows.)"""
    starts = query_start_loc.to(torch.int64)
    counts = starts[1:] - starts[:-1]
    actual = int(starts[-1])
    request = torch.repeat_interleave(torch.arange(len(counts)), counts)
    seen = seq_lens.to(torch.int64)[request] - counts[request] + torch.arange(actual) - starts[request] + 1
    tables = block_tables.index_select(0, request)
    if rows is None or rows == actual:
        return seen.to(torch.int32), tables
    lens = torch.zeros(rows, dtype=torch.int32)
    lens[:actual] = seen
    padded = torch.zeros(rows, block_tables.shape[1], dtype=block_tables.dtype)
    padded[:actual] = tables
    return lens, padded


def _float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()


LAYER_TENSORS = ("input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o_proj", "post_norm", "gate_up", "down")


class DecodeStack:
    """A Llama-family decoder's layers for `decode_forward16`: one C call runs a pure-decode step (one new
    token per request) through every layer and the final norm, reading the 16-bit weights and paged cache in
    place. Built once per KV cache; holds the tensors it points at. Only construct when available().

    layers: per layer a dict of LAYER_TENSORS (16-bit, contiguous, all in one dtype; qkv_bias, q_norm and
    k_norm may be None; the MATMULS may instead be kernels/cpu/quant.PackedWeights) plus "kv_cache" ([2, num_blocks,
    block_size, Hk, D], the same dtype).
    """

    def __init__(self, layers: list[dict[str, torch.Tensor | None]], final_norm: torch.Tensor,
                 cos_sin: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
                 scale: float):
        dtype = final_norm.dtype
        kept = [final_norm, cos_sin]
        for layer in layers:
            for name in (*LAYER_TENSORS, "kv_cache"):
                tensor = layer[name]
                if not isinstance(tensor, torch.Tensor):
                    kept.append(tensor)
                    continue
                if tensor.dtype != dtype or not tensor.is_contiguous() or tensor.device.type != "cpu":
                    raise ValueError(f"DecodeStack: {name} must be a contiguous CPU {dtype} tensor")
                kept.append(tensor)
        if dtype not in SUPPORTED or cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous():
            raise ValueError("DecodeStack: needs bf16/fp16 weights and a contiguous float32 cos/sin table")
        kv = layers[0]["kv_cache"]
        if not supports_attention(kv[0], num_heads) or head_dim % 2:
            raise ValueError("DecodeStack: the decode attention kernel does not take this cache layout")
        self._kept = kept
        self._layers = (_Layer * len(layers))()
        for slot, layer in zip(self._layers, layers):
            for name in LAYER_TENSORS:
                tensor = layer[name]
                if name in MATMULS:
                    setattr(slot, name, weight_descriptor(tensor))
                else:
                    setattr(slot, name, None if tensor is None else tensor.data_ptr())
            slot.key_cache = layer["kv_cache"][0].data_ptr()
            slot.value_cache = layer["kv_cache"][1].data_ptr()
        self.hidden = final_norm.shape[0]
        self._model = _Model(
            num_layers=len(layers), hidden=self.hidden, num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, intermediate=layers[0]["down"].shape[1], block_size=kv.shape[2], eps=eps,
            scale=scale, is_bf16=int(dtype == torch.bfloat16), layers=self._layers,
            final_norm=final_norm.data_ptr(), cos_sin=cos_sin.data_ptr(),
        )
        self.max_position = cos_sin.shape[0]
        self.kv_caches = [layer["kv_cache"] for layer in layers]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                 seq_lens: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] float32 (the embeddings; overwritten) -> the normed last hidden states [T, hidden].
        Token r is request r's one new token: positions/slot_mapping int64 [T], seq_lens int32 [T],
        block_tables int32 [T, max_blocks]."""
        if x.dtype != torch.float32 or not x.is_contiguous() or x.shape[1] != self.hidden:
            raise ValueError(f"DecodeStack: x must be contiguous float32 [T, {self.hidden}]")
        num_tokens = x.shape[0]
        positions = positions.to(torch.int64).contiguous()
        slot_mapping = slot_mapping.to(torch.int64).contiguous()
        seq_lens = seq_lens.to(torch.int32).contiguous()
        block_tables = block_tables.to(torch.int32).contiguous()
        if not (len(positions) == len(slot_mapping) == len(seq_lens) == len(block_tables) == num_tokens):
            raise ValueError("DecodeStack: one position, slot, length and block table per token")
        if num_tokens and int(positions.max()) >= self.max_position:
            raise ValueError(f"DecodeStack: position beyond the rotary table ({self.max_position})")
        _library().decode_forward16(ctypes.byref(self._model), x.data_ptr(), positions.data_ptr(),
                                    slot_mapping.data_ptr(), seq_lens.data_ptr(), block_tables.data_ptr(),
                                    block_tables.shape[1], num_tokens, torch.get_num_threads())
        return x
