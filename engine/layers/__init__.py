"""Model building blocks: tensor-parallel linears and embeddings, RMSNorm, rotary embedding."""

from engine.layers.layernorm import RMSNorm
from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from engine.layers.rotary_embedding import RotaryEmbedding
from engine.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.weights import CheckpointWeights, SafetensorsSource, TensorSource, WeightSource

__all__ = [
    "CheckpointWeights",
    "ColumnParallelLinear",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "SafetensorsSource",
    "TensorSource",
    "VocabParallelEmbedding",
    "WeightSource",
]
