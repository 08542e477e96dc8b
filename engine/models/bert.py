"""The BERT-family encoder: BertModel, RobertaModel and XLMRobertaModel from one file.

    h = LayerNorm(word(tokens) + position(positions) + token_type(0))
    for each layer:
        h = LayerNorm(h + dense(attention(q, k, v)))      q, k, v = qkv_proj(h), every token sees its whole sequence
        h = LayerNorm(h + dense(gelu(intermediate(h))))

The batch is packed (sequences back to back, [T, hidden]) and attention is bidirectional within each sequence
(engine/attention/bidirectional.py); nothing is cached. Module names follow HF's BertModel so that checkpoint
tensors route by name (`checkpoint_name` strips the `bert.` / `roberta.` prefix of task checkpoints and drops
the pooler and heads that pooling does not use); q, k and v load into one fused projection. Linears are the
tensor-parallel ones the decoders use, so the encoder shards the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.bidirectional import EncoderMetadata, bidirectional_attention
from engine.layers import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear, VocabParallelEmbedding
from engine.layers.layernorm import LayerNorm
from engine.layers.onednn_matmul import fused_linear_gelu
from engine.layers.weights import CheckpointWeights, new_parameter
from engine.models.encoder_args import EncoderArgs

_PREFIXES = ("bert.", "roberta.")
_UNUSED = ("pooler.", "cls.", "lm_head.", "classifier.", "embeddings.position_ids")


class Embedding(CheckpointWeights, nn.Module):
    """A replicated lookup table (positions, token types): every rank holds all of it."""

    def __init__(self, rows: int, hidden_size: int, *, dtype: torch.dtype):
        super().__init__()
        self.weight = new_parameter(rows, hidden_size, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class BertEmbeddings(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(args.vocab_size, args.hidden_size, tp_rank=tp_rank,
                                                      tp_size=tp_size, dtype=dtype)
        self.position_embeddings = Embedding(args.max_positions, args.hidden_size, dtype=dtype)
        self.token_type_embeddings = Embedding(args.type_vocab_size, args.hidden_size, dtype=dtype)
        self.LayerNorm = LayerNorm(args.hidden_size, args.layer_norm_eps, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # one segment (token type 0) per sequence: what a single text is tokenized to
        h = self.word_embeddings(input_ids).to(dtype) + self.position_embeddings(positions).to(dtype)
        return self.LayerNorm(h + self.token_type_embeddings.weight[0].to(dtype))


class BertSelfAttention(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        self.qkv_proj = QKVParallelLinear(args.hidden_size, args.head_dim, args.num_heads, args.num_heads, True,
                                          tp_rank=tp_rank, tp_size=tp_size, dtype=dtype)
        self.num_heads = self.qkv_proj.num_heads          # per rank
        self.head_dim = args.head_dim
        self.scale = args.head_dim**-0.5

    def forward(self, hidden: torch.Tensor, metadata: EncoderMetadata) -> torch.Tensor:
        return bidirectional_attention(self.qkv_proj(hidden), self.num_heads, self.head_dim, metadata, self.scale)


class DenseLayerNorm(nn.Module):
    """HF's BertSelfOutput / BertOutput: LayerNorm(residual + dense(x)), the dense layer row-parallel."""

    def __init__(self, input_size: int, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        self.dense = RowParallelLinear(input_size, args.hidden_size, True, tp_rank=tp_rank, tp_size=tp_size,
                                       dtype=dtype)
        self.LayerNorm = LayerNorm(args.hidden_size, args.layer_norm_eps, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.self = BertSelfAttention(args, **tp)
        self.output = DenseLayerNorm(args.num_heads * args.head_dim, args, **tp)

    def forward(self, hidden: torch.Tensor, metadata: EncoderMetadata) -> torch.Tensor:
        return self.output(self.self(hidden, metadata), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        size = args.intermediate_size
        if size % tp_size:
            raise ValueError(f"intermediate_size {size} is not divisible by {tp_size} (tensor-parallel split)")
        local = size // tp_size
        self.dense = ColumnParallelLinear(args.hidden_size, {None: (size, local, tp_rank * local)}, True, dtype)
        self.exact_gelu = args.hidden_act == "gelu"
        self.activation = args.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact_gelu:
            fused = fused_linear_gelu(self.dense, x)      # one oneDNN call where the weights are packed
            if fused is not None:
                return fused
        y = self.dense(x)
        if self.activation == "relu":
            return F.relu(y)
        return F.gelu(y, approximate="none" if self.exact_gelu else "tanh")


class BertLayer(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.attention = BertAttention(args, **tp)
        self.intermediate = BertIntermediate(args, **tp)
        self.output = DenseLayerNorm(args.intermediate_size, args, **tp)

    def forward(self, hidden: torch.Tensor, metadata: EncoderMetadata) -> torch.Tensor:
        hidden = self.attention(hidden, metadata)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, args: EncoderArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(args, tp_rank=tp_rank, tp_size=tp_size, dtype=dtype)
                                   for _ in range(args.num_layers))


class BertModel(nn.Module):
    """The encoder the pooling runner drives: forward() to the last hidden states of a packed batch."""

    # (fused parameter, checkpoint name, shard id): HF checkpoints store q, k and v separately.
    STACKED_PARAMS = (
        ("qkv_proj", "query", "q"),
        ("qkv_proj", "key", "k"),
        ("qkv_proj", "value", "v"),
    )

    def __init__(self, args: EncoderArgs, backend=None, *, tp_rank: int = 0, tp_size: int = 1,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.args = args
        self.embeddings = BertEmbeddings(args, **tp)
        self.encoder = BertEncoder(args, **tp)
        self.num_layers = args.num_layers
        self.dtype = dtype
        self.activation_dtype = dtype          # float32 for 16-bit weights on CPUs (see engine/models/llama.py)

    @staticmethod
    def checkpoint_name(name: str) -> str | None:
        """The parameter a checkpoint tensor loads into (HF's name without a task model's prefix), or None
        for tensors pooling does not use (the pooler, task heads, the position-id buffer)."""
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if name.startswith(_UNUSED):
            return None
        if name.endswith(".gamma") or name.endswith(".beta"):      # TF-era LayerNorm names
            name = name[:-6] + ".weight" if name.endswith(".gamma") else name[:-5] + ".bias"
        return name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: EncoderMetadata) -> torch.Tensor:
        """input_ids, positions [T] int64 (positions count from 0 in each sequence) -> hidden [T, hidden]."""
        hidden = self.embeddings(input_ids, positions + self.args.position_offset, self.activation_dtype)
        for layer in self.encoder.layer:
            hidden = layer(hidden, metadata)
        return hidden
