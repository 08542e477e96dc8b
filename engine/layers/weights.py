"""How checkpoint tensors reach a rank's parameters.

A checkpoint tensor arrives as a `WeightSource`: its full shape, plus a way to read the whole tensor or a
slice along one dimension. Backed by a safetensors slice, reading a slice touches only those bytes, so a
rank never materialises the parts of a large tensor that belong to other ranks. Every layer mixes in
`CheckpointWeights` to say, per parameter and shard id, which full checkpoint shape it expects and which
part of the tensor it keeps.
"""

from __future__ import annotations

from typing import Protocol

import torch

ShardId = str | int | None


class WeightSource(Protocol):
    shape: tuple[int, ...]

    def read(self) -> torch.Tensor: ...

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor: ...


class TensorSource:
    """A checkpoint tensor that is already in memory (dummy weights, tests)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def read(self) -> torch.Tensor:
        return self.tensor

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        return self.tensor.narrow(dim, start, length)


class SafetensorsSource:
    """A tensor in a safetensors file, read lazily: only the requested slice is loaded."""

    def __init__(self, tensor_slice):
        self._slice = tensor_slice
        self.shape = tuple(tensor_slice.get_shape())

    def read(self) -> torch.Tensor:
        return self._slice[:]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]


class CheckpointWeights:
    """Mixin for modules whose parameters load from checkpoint tensors.

    The default is a replicated parameter: the checkpoint tensor has the parameter's shape and is copied
    whole. Parallel layers override both methods.
    """

    def checkpoint_shape(self, param: torch.nn.Parameter, shard_id: ShardId = None) -> tuple[int, ...]:
        return tuple(param.shape)

    def weight_loader(self, param: torch.nn.Parameter, source: WeightSource, shard_id: ShardId = None) -> None:
        param.data.copy_(source.read())


def new_parameter(*shape: int, dtype: torch.dtype) -> torch.nn.Parameter:
    """An uninitialised inference parameter on the current default device (the loader fills it)."""
    return torch.nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
