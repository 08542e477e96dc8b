"""GGUF's quantized block types read as codes and scales, in torch: the reference of the quantized matmuls.

Every type with a kernel here is, per group of values, weight = scale * code + offset with an unsigned code:

    type   values/block  bytes  group  code            scale          offset
    Q4_0        32         18     32   4 bits          d              -8 d
    Q4_1        32         20     32   4 bits          d              m
    Q5_0        32         22     32   5 bits          d              -16 d
    Q5_1        32         24     32   5 bits          d              m
    Q8_0        32         34     32   q + 128         d              -128 d
    Q4_K       256        144     32   4 bits          d * sc_j       -dmin * m_j      (6-bit sc_j, m_j)
    Q5_K       256        176     32   5 bits          d * sc_j       -dmin * m_j
    Q6_K       256        210     16   6 bits          d * sc_g       -32 d * sc_g     (int8 sc_g)

which is how llama.cpp's ggml-quants defines them (read, not copied). The CPU kernels (kernels/cpu/quant.c)
decode the same codes, scales and offsets; the GPU kernel (kernels/triton_quant_matmul.py) takes them
repacked. `quant_matmul_torch` (dequantize, then a float32 matmul) is the reference both are tested against;
`dequantize` is checked against the gguf package's own.
"""

from __future__ import annotations

import torch

# GGML type id -> (name, values per block, bytes per block) for the types with kernels
QUANT_TYPES: dict[int, tuple[str, int, int]] = {
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
}
TYPE_IDS = {name: type_id for type_id, (name, _, _) in QUANT_TYPES.items()}
FOUR_BIT = (2, 3, 12)          # codes that fit in a nibble (packed two a byte on the GPU)


def bytes_by_type(parts) -> dict[str, int]:
    """{type name: bytes} of (GGML type id, bytes) pairs: what a weight's forms report for the startup line."""
    sizes: dict[str, int] = {}
    for type_id, nbytes in parts:
        name = QUANT_TYPES[type_id][0]
        sizes[name] = sizes.get(name, 0) + nbytes
    return sizes


def row_bytes(type_id: int, k: int) -> int:
    """Bytes of one row of k values of the type (k a multiple of its block)."""
    _, values, size = QUANT_TYPES[type_id]
    if k % values:
        raise ValueError(f"{QUANT_TYPES[type_id][0]} rows hold multiples of {values} values, not {k}")
    return k // values * size


def random_blocks(type_id: int, rows: int, k: int, seed: int) -> torch.Tensor:
    """Valid random blocks (uint8 [rows, row_bytes]) for tests and benchmarks at real shapes: random codes
    and scale bytes, the fp16 scales set to sizes real weights have (values within about ±1) and varying
    from block to block."""
    name, values, size = QUANT_TYPES[type_id]
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (rows * k // values, size), dtype=torch.uint8, generator=generator)

    def f16(low: float, high: float) -> torch.Tensor:
        scales = torch.empty(blocks.shape[0]).uniform_(low, high, generator=generator)
        return scales.half().view(torch.uint8).reshape(-1, 2)

    if values == 32:
        blocks[:, 0:2] = f16(0.002, 0.03) if name != "Q8_0" else f16(0.0005, 0.008)
        if name in ("Q4_1", "Q5_1"):
            blocks[:, 2:4] = f16(-0.3, 0.0)
    elif name == "Q6_K":
        blocks[:, 208:210] = f16(0.0001, 0.0005)
    else:
        blocks[:, 0:2], blocks[:, 2:4] = f16(0.0005, 0.002), f16(0.0005, 0.002)
    return blocks.reshape(rows, -1)


def _f16(raw: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of each block, as float32 [blocks, 1]."""
    return raw[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """[blocks, n] bytes -> [blocks, 2n]: the low nibbles, then the high ones."""
    return torch.cat([q & 15, q >> 4], dim=1)


def _bits(raw: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Bits [0, count) of the little-endian bytes from `start`, as [blocks, count] 0/1 uint8."""
    data = raw[:, start:start + count // 8]
    shifts = torch.arange(8, dtype=torch.uint8, device=raw.device)
    return ((data[:, :, None] >> shifts) & 1).reshape(raw.shape[0], count)


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's twelve bytes -> (scale, min) [blocks, 8], 6 bits each."""
    s = scales.to(torch.int32)
    sc = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], dim=1)
    mn = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)
    return sc.float(), mn.float()


def unpack(raw: torch.Tensor, type_id: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """raw uint8 [rows, row_bytes] blocks -> (codes uint8 [rows, k], scale and offset float32 [rows, k / group],
    group): weight[r, i] = scale[r, i // group] * codes[r, i] + offset[r, i // group]."""
    name, values, size = QUANT_TYPES[type_id]
    rows = raw.shape[0]
    b = raw.reshape(-1, size)
    if values == 32:
        d = _f16(b, 0)
        if name == "Q8_0":
            codes = (b[:, 2:34].view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
            scale, offset = d, -128 * d
        elif name in ("Q4_0", "Q4_1"):
            start = 2 if name == "Q4_0" else 4
            codes = _nibbles(b[:, start:start + 16])
            scale, offset = d, (-8 * d if name == "Q4_0" else _f16(b, 2))
        else:
            start = 2 if name == "Q5_0" else 4
            codes = _nibbles(b[:, start + 4:start + 20]) | (_bits(b, start, 32) << 4)
            scale, offset = d, (-16 * d if name == "Q5_0" else _f16(b, 2))
        group = 32
    elif name == "Q6_K":
        ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
        low = torch.cat([ql[:, :, 0:32] & 15, ql[:, :, 32:64] & 15, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], dim=2)
        high = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=2)
        codes = (low | (high << 4)).reshape(-1, 256)
        sc = b[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(b, 208)
        scale, offset, group = d * sc, -32 * d * sc, 16
    else:                                                  # Q4_K, Q5_K
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 48:176] if name == "Q5_K" else b[:, 16:144]
        chunks = qs.reshape(-1, 4, 32)
        codes = torch.cat([chunks & 15, chunks >> 4], dim=2)              # [blocks, 4, 64]
        if name == "Q5_K":
            qh = b[:, 16:48]
            high = torch.stack([torch.cat([(qh >> (2 * c)) & 1, (qh >> (2 * c + 1)) & 1], dim=1) for c in range(4)], 1)
            codes = codes | (high << 4)
        codes = codes.reshape(-1, 256)
        scale, offset, group = d * sc, -dmin * mn, 32
    return (codes.reshape(rows, k), scale.reshape(rows, k // group), offset.reshape(rows, k // group), group)


def dequantize(raw: torch.Tensor, type_id: int, k: int) -> torch.Tensor:
    """raw uint8 [rows, row_bytes] -> float32 [rows, k]."""
    codes, scale, offset, group = unpack(raw, type_id, k)
    rows = codes.shape[0]
    values = codes.float().reshape(rows, k // group, group) * scale[:, :, None] + offset[:, :, None]
    return values.reshape(rows, k)


def quant_matmul_torch(x: torch.Tensor, weight: QuantizedWeight) -> torch.Tensor:
    """x [M, K] @ Wᵀ in float32 (the weight dequantized first)."""
    return x.float() @ weight.dequantize().to(x.device).T


class QuantizedWeight:
    """A matmul weight [out_features, in_features] kept in GGUF blocks: parts stacked by output rows, each
    (GGML type id, uint8 [rows, row_bytes] blocks) as the file holds them (a fused q/k/v or gate/up may mix
    types, as llama-quantize's Q4_K_M and Q5_K_M presets do). The kernels read the blocks in place."""

    def __init__(self, parts: list[tuple[int, torch.Tensor]], in_features: int):
        if not parts or len(parts) > MAX_PARTS:
            raise ValueError(f"a quantized weight has 1 to {MAX_PARTS} parts, got {len(parts)}")
        for type_id, raw in parts:
            if type_id not in QUANT_TYPES:
                raise ValueError(f"GGML type {type_id} has no quantized kernel")
            if raw.dtype != torch.uint8 or raw.dim() != 2 or not raw.is_contiguous():
                raise ValueError("quantized blocks must be a contiguous uint8 [rows, row_bytes] tensor")
            if raw.shape[1] != row_bytes(type_id, in_features):
                raise ValueError(f"{QUANT_TYPES[type_id][0]} rows of {in_features} values take "
                                 f"{row_bytes(type_id, in_features)} bytes, not {raw.shape[1]}")
        self.parts = parts
        self.in_features = in_features
        self.out_features = sum(raw.shape[0] for _, raw in parts)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def device(self) -> torch.device:
        return self.parts[0][1].device

    @property
    def nbytes(self) -> int:
        return sum(raw.numel() for _, raw in self.parts)

    def bytes_by_type(self) -> dict[str, int]:
        return bytes_by_type((type_id, raw.numel()) for type_id, raw in self.parts)

    def dequantize(self) -> torch.Tensor:
        """float32 [out_features, in_features]."""
        return torch.cat([dequantize(raw, type_id, self.in_features) for type_id, raw in self.parts])

    def matmul(self, x: torch.Tensor, precise: bool = False) -> torch.Tensor:
        """x @ selfᵀ by the reference: float32 (x's dtype on CUDA); float activations, so always precise."""
        y = quant_matmul_torch(x, self)
        return y.to(x.dtype) if x.is_cuda else y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of a one-part weight, dequantized: float32 [n, in_features] on ids' device."""
        type_id, raw = self.parts[0]
        return dequantize(raw[ids.to(raw.device)], type_id, self.in_features).to(ids.device)


MAX_PARTS = 4          # kernels/cpu/kernels.h WEIGHT_PARTS
