"""Linear layers split across tensor-parallel ranks (Megatron-LM's column/row scheme).

A column-parallel layer splits its output features: rank r computes its own slice of Y = X Wᵀ and no
communication is needed. A row-parallel layer splits its input features: each rank multiplies its slice of
X by its slice of W and the partial sums are all-reduced. Attention and MLP each pair a column-parallel
layer (q/k/v, gate/up) with a row-parallel one (o, down), so one all-reduce per block suffices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.distributed import all_reduce
from engine.layers.cpu_matmul import UpcastMatmul
from engine.layers.quantized import QuantizedMatmul, QuantizedSource
from engine.layers.weights import CheckpointWeights, ShardId, WeightSource, new_parameter


@dataclass(frozen=True)
class OutputShard:
    """One checkpoint tensor's share of a rank's fused column-parallel weight."""

    full_size: int     # output rows of the checkpoint tensor
    local_size: int    # rows this rank keeps
    start: int         # first checkpoint row this rank keeps
    offset: int        # where those rows sit in the rank's fused weight


class ColumnParallelLinear(UpcastMatmul, QuantizedMatmul, CheckpointWeights, nn.Module):
    """Y = X Wᵀ + b with W's output rows split across ranks.

    W may fuse several checkpoint tensors (q/k/v, gate/up), each sharded on its own and stacked on the rank
    in shard-id order, so one matmul replaces several. Subclasses say how each tensor is split.
    """

    def __init__(self, input_size: int, shards: dict[ShardId, tuple[int, int, int]], bias: bool,
                 dtype: torch.dtype):
        super().__init__()
        self.shards: dict[ShardId, OutputShard] = {}
        offset = 0
        for shard_id, (full_size, local_size, start) in shards.items():
            self.shards[shard_id] = OutputShard(full_size, local_size, start, offset)
            offset += local_size
        self.input_size = input_size
        self.output_size = offset        # per rank
        self.weight = new_parameter(offset, input_size, dtype=dtype)
        self.bias = new_parameter(offset, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)

    def checkpoint_shape(self, param: nn.Parameter, shard_id: ShardId = None) -> tuple[int, ...]:
        return (self.shards[shard_id].full_size, *param.shape[1:])

    def weight_loader(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId = None) -> None:
        shard = self.shards[shard_id]
        param.data.narrow(0, shard.offset, shard.local_size).copy_(
            source.narrow(0, shard.start, shard.local_size)
        )

    def quantized_part(self, source: QuantizedSource, shard_id: ShardId) -> QuantizedSource:
        shard = self.shards[shard_id]
        return source.narrow(0, shard.start, shard.local_size)

    def part_order(self) -> list[ShardId]:
        return list(self.shards)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several checkpoint linears with the same input (gate_proj and up_proj), shard ids 0, 1, ..."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, *, tp_rank: int, tp_size: int,
                 dtype: torch.dtype):
        shards = {}
        for i, size in enumerate(output_sizes):
            local = _split(size, tp_size, f"output size {size}")
            shards[i] = (size, local, tp_rank * local)
        super().__init__(input_size, shards, bias, dtype)


class QKVParallelLinear(ColumnParallelLinear):
    """q_proj, k_proj and v_proj fused (shard ids "q", "k", "v"), split by attention head.

    Query heads are always split evenly. KV heads are split when tp divides them; when tp exceeds them
    (tp a multiple of num_kv_heads), each KV head is replicated on tp / num_kv_heads consecutive ranks, and
    every rank keeps the one KV head its query heads read.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, *,
                 tp_rank: int, tp_size: int, dtype: torch.dtype):
        self.num_heads = _split(num_heads, tp_size, f"num_attention_heads {num_heads}")
        if num_kv_heads >= tp_size:
            self.num_kv_heads = _split(num_kv_heads, tp_size, f"num_key_value_heads {num_kv_heads}")
            first_kv_head = tp_rank * self.num_kv_heads
        else:
            replicas = _split(tp_size, num_kv_heads, f"tensor_parallel_size {tp_size} (> KV heads)")
            self.num_kv_heads = 1
            first_kv_head = tp_rank // replicas
        q_rows, kv_rows = self.num_heads * head_dim, self.num_kv_heads * head_dim
        kv_full, kv_start = num_kv_heads * head_dim, first_kv_head * head_dim
        shards = {
            "q": (num_heads * head_dim, q_rows, tp_rank * q_rows),
            "k": (kv_full, kv_rows, kv_start),
            "v": (kv_full, kv_rows, kv_start),
        }
        super().__init__(hidden_size, shards, bias, dtype)
        self.q_size, self.kv_size = q_rows, kv_rows


class RowParallelLinear(UpcastMatmul, QuantizedMatmul, CheckpointWeights, nn.Module):
    """Y = X Wᵀ + b with W's input columns split across ranks; the partial products are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool, *, tp_rank: int, tp_size: int,
                 dtype: torch.dtype):
        super().__init__()
        self.tp_size = tp_size
        self.input_size = input_size
        self.local_input = _split(input_size, tp_size, f"input size {input_size}")
        self.start = tp_rank * self.local_input
        self.weight = new_parameter(output_size, self.local_input, dtype=dtype)
        self.bias = new_parameter(output_size, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.tp_size == 1:
            return self.matmul(x, out_dtype=out_dtype)
        y = all_reduce(self.matmul(x, with_bias=False, out_dtype=out_dtype))
        # The bias is added once, after the sum, not once per rank.
        return y if self.bias is None else y + self.bias

    def checkpoint_shape(self, param: nn.Parameter, shard_id: ShardId = None) -> tuple[int, ...]:
        if param is self.weight:
            return (param.shape[0], self.input_size)
        return tuple(param.shape)

    def weight_loader(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId = None) -> None:
        if param is self.weight:
            param.data.copy_(source.narrow(1, self.start, self.local_input))
        else:
            param.data.copy_(source.read())

    def takes_blocks(self, block: int) -> bool:
        return self.local_input % block == 0

    def quantized_part(self, source: QuantizedSource, shard_id: ShardId) -> QuantizedSource:
        return source if self.tp_size == 1 else source.narrow(1, self.start, self.local_input)


def _split(size: int, parts: int, what: str) -> int:
    if size % parts:
        raise ValueError(f"{what} is not divisible by {parts} (tensor-parallel split)")
    return size // parts
