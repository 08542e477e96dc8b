"""The token embedding and the LM head, split across tensor-parallel ranks by vocabulary rows.

Rank r holds rows [r * n, (r + 1) * n) with n = ceil(vocab / tp); the last rank's rows past the vocabulary
are zero padding. Both layers shard identically, so tied embeddings are one tensor per rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed import all_gather, all_reduce
from engine.layers.cpu_matmul import UpcastMatmul
from engine.layers.quantized import QuantizedMatmul, QuantizedSource
from engine.layers.weights import CheckpointWeights, ShardId, WeightSource, new_parameter


class VocabParallelEmbedding(QuantizedMatmul, CheckpointWeights, nn.Module):
    """Embedding lookup where each rank holds a slice of the vocabulary; ids outside the slice contribute
    zeros and the ranks' partial embeddings are all-reduced. A quantized table (`qweight`) is dequantized
    row by row as it is looked up, into the layer's dtype (what the dequantized table would hold)."""

    def __init__(self, vocab_size: int, hidden_size: int, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = tp_size
        self.rows = -(-vocab_size // tp_size)
        self.vocab_start = tp_rank * self.rows
        self.vocab_end = min(self.vocab_start + self.rows, vocab_size)
        self.weight = new_parameter(self.rows, hidden_size, dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill_(outside, 0)
        embeddings = self._lookup(local_ids).masked_fill_(outside[:, None], 0)
        return all_reduce(embeddings)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.qweight is None:
            return F.embedding(ids, self.weight)
        return self.qweight.rows(ids).to(self.weight.dtype)

    def checkpoint_shape(self, param: nn.Parameter, shard_id: ShardId = None) -> tuple[int, ...]:
        return (self.vocab_size, param.shape[1])

    def weight_loader(self, param: nn.Parameter, source: WeightSource, shard_id: ShardId = None) -> None:
        kept = max(0, self.vocab_end - self.vocab_start)
        if kept:
            param.data[:kept].copy_(source.narrow(0, self.vocab_start, kept))
        param.data[kept:].zero_()

    def quantized_part(self, source: QuantizedSource, shard_id: ShardId) -> QuantizedSource:
        kept = max(0, self.vocab_end - self.vocab_start)
        raw = source.raw.narrow(0, self.vocab_start, kept)
        if kept < self.rows:                        # the last rank's padding rows: all-zero blocks are zeros
            raw = torch.cat([raw, raw.new_zeros(self.rows - kept, raw.shape[1])])
        return QuantizedSource(source.type_id, raw, source.shape[1])


class ParallelLMHead(UpcastMatmul, VocabParallelEmbedding):
    """hidden -> logits: each rank computes its vocabulary slice and the slices are all-gathered, so every
    rank holds the full float32 logits (and all ranks sample identically)."""

    upcast_min_rows = 6          # the vocab-sized GEMM stays memory-bound for a few more rows

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.matmul_float(hidden, with_bias=False)
        if logits is None:
            logits = F.linear(hidden.to(self.weight.dtype), self.weight)
        if self.tp_size > 1:
            logits = all_gather(logits, dim=-1)[:, : self.vocab_size]
        return logits.float()
