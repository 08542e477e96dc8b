"""Matmul layers whose weight stays in a GGUF file's quantized blocks (`--quantization gguf`).

The loader hands such a layer each of its checkpoint tensors as a `QuantizedSource` (the file's blocks, rows
in the HF order) instead of float values; the layer keeps this rank's rows (or, row-parallel, its columns
when they fall on block boundaries) and `finish_quantized()` stacks them into one kernels.QuantizedWeight in
the order of its fused parts, adjacent parts of one type merged into one. The layer's 16-bit parameter is
then replaced by an empty one (it was never written, so it never took memory on a CPU; on a GPU it is
freed), and its matmuls go to kernels.prepare_quantized's form of the weight: repacked for the C kernels on
a CPU, packed for the Triton kernel on CUDA.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels import prepare_quantized
from kernels.gguf_blocks import QUANT_TYPES, QuantizedWeight

ShardId = str | int | None


class QuantizedSource:
    """A checkpoint matrix as the file's blocks: uint8 [rows, row_bytes] of GGML type `type_id`, shape
    [rows, in_features] in values."""

    def __init__(self, type_id: int, raw: torch.Tensor, in_features: int):
        self.type_id, self.raw = type_id, raw
        self.shape = (raw.shape[0], in_features)

    @property
    def block(self) -> int:
        return QUANT_TYPES[self.type_id][1]

    def narrow(self, dim: int, start: int, length: int) -> QuantizedSource:
        if dim == 0:
            return QuantizedSource(self.type_id, self.raw.narrow(0, start, length), self.shape[1])
        if start % self.block or length % self.block:
            raise ValueError(f"columns [{start}, {start + length}) do not fall on {self.block}-value blocks")
        size = QUANT_TYPES[self.type_id][2]
        raw = self.raw.narrow(1, start // self.block * size, length // self.block * size).contiguous()
        return QuantizedSource(self.type_id, raw, length)


class QuantizedMatmul:
    """Mixed into the matmul layers and the embedding: their weight may be a QuantizedWeight (`qweight`)."""

    qweight = None          # kernels.prepare_quantized's form of the layer's QuantizedWeight

    def takes_blocks(self, block: int) -> bool:
        """Whether this rank's part of the weight is whole blocks of `block` values (row splits always are)."""
        return True

    def quantized_part(self, source: QuantizedSource, shard_id: ShardId) -> QuantizedSource:
        """This rank's part of a checkpoint tensor (the layers override it as their weight_loader splits)."""
        return source

    def part_order(self) -> list[ShardId]:
        return [None]

    def load_quantized(self, source: QuantizedSource, shard_id: ShardId = None) -> None:
        pending = self.__dict__.setdefault("_pending_blocks", {})
        pending[shard_id] = self.quantized_part(source, shard_id)

    def finish_quantized(self) -> None:
        """Stack the loaded parts into `qweight` and drop the 16-bit parameter."""
        pending = self.__dict__.pop("_pending_blocks")
        parts: list[tuple[int, torch.Tensor]] = []
        for shard_id in self.part_order():
            part = pending[shard_id]
            if parts and parts[-1][0] == part.type_id:
                parts[-1] = (part.type_id, torch.cat([parts[-1][1], part.raw]))
            else:
                parts.append((part.type_id, part.raw.contiguous()))
        self.use_quantized(QuantizedWeight(parts, self.weight.shape[1]))

    def use_quantized(self, weight) -> None:
        """Multiply by `weight` (a QuantizedWeight, or one prepare_quantized made) from now on; also how a
        tied LM head shares the embedding's."""
        device = self.weight.device
        self.qweight = prepare_quantized(weight, device) if isinstance(weight, QuantizedWeight) else weight
        self.weight = nn.Parameter(torch.empty(0, weight.in_features, dtype=self.weight.dtype, device=device),
                                   requires_grad=False)
