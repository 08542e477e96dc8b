"""The Llama-family decoder: Llama, Mistral, Qwen2 and Qwen3 from one file, switched by ModelArgs flags.

    h   = embed(tokens)
    for each layer:
        h = h + o_proj(attention(rope(q), rope(k), v))     q, k, v = qkv_proj(rms_norm(h))
        h = h + down_proj(silu(gate) * up)                 gate, up = gate_up_proj(rms_norm(h))
    logits = lm_head(rms_norm(h))

Attention is grouped-query over the paged KV cache (the backend writes this step's keys and values, then
attends). Qwen2 adds a bias to q, k and v; Qwen3 RMS-normalises each head of q and k before RoPE. Tokens of
all requests travel as one flattened batch [T, hidden]; the residual add is fused into the next RMSNorm.
Parameter names follow the HF checkpoints except the fused qkv_proj and gate_up_proj (see STACKED_PARAMS).

`activation_dtype` is the dtype of the residual stream; it is the model dtype except for 16-bit models on
CPUs without half-precision arithmetic (engine/layers/cpu_matmul.py), which keep 16-bit weights and KV
cache but carry activations in float32, as llama.cpp does: every elementwise op on a bf16 tensor would
otherwise widen and narrow it again, and the matmuls accumulate in float32 anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from engine.models.model_args import ModelArgs
from kernels import silu_and_mul


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, rotary_emb: RotaryEmbedding, backend: AttentionBackend, *,
                 tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.qkv_proj = QKVParallelLinear(
            args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, args.qkv_bias, **tp
        )
        self.o_proj = RowParallelLinear(args.num_heads * args.head_dim, args.hidden_size, args.o_bias, **tp)
        if args.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, dtype=dtype)
        self.qk_norm = args.qk_norm
        self.rotary_emb = rotary_emb
        self.backend = backend
        self.num_heads = self.qkv_proj.num_heads          # per rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads    # per rank
        self.head_dim = args.head_dim
        self.scale = args.head_dim**-0.5

    def forward(self, rope: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """rope: the step's RotaryEmbedding.prepare(positions)."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if not qkv.is_cuda and not self.qk_norm:
            # q and k are adjacent columns of qkv: rotate all their heads in one pass
            qk = qkv[:, : q_size + kv_size].view(num_tokens, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = self.rotary_emb.rotate(rope, qk).split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, q_size : q_size + kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary_emb(rope, q, k)
        out = self.backend.forward(q, k, v, kv_cache, metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up in one matmul."""

    def __init__(self, args: ModelArgs, *, tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        size = args.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(args.hidden_size, [size, size], args.mlp_bias, **tp)
        self.down_proj = RowParallelLinear(size, args.hidden_size, args.mlp_bias, **tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj.matmul_native16(x)
        if gate_up is not None:     # a CPU's native 16-bit matmul: the gate stays in 16 bits for the next one
            return self.down_proj(silu_and_mul(gate_up), out_dtype=x.dtype)
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, rotary_emb: RotaryEmbedding, backend: AttentionBackend, *,
                 tp_rank: int, tp_size: int, dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(args, rotary_emb, backend, **tp)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype=dtype)
        self.mlp = MLP(args, **tp)

    def forward(self, rope: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output, the residual stream before it): the caller's next RMSNorm adds them."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(rope, hidden, kv_cache, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs, backend: AttentionBackend, *, tp_rank: int, tp_size: int,
                 dtype: torch.dtype):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, **tp)
        # One cos/sin table serves every layer.
        self.rotary_emb = rotary_emb = RotaryEmbedding(args.head_dim, args.max_positions, args.rope_theta,
                                                       args.rope_scaling)
        self.layers = nn.ModuleList(
            DecoderLayer(args, rotary_emb, backend, **tp) for _ in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata, activation_dtype: torch.dtype | None = None) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        if activation_dtype is not None:
            hidden = hidden.to(activation_dtype)
        rope = self.rotary_emb.prepare(positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(rope, hidden, residual, kv_cache, metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """The causal LM the model runner drives: forward() to hidden states, compute_logits() where it samples."""

    # (fused parameter, checkpoint name, shard id): HF checkpoints store these separately.
    STACKED_PARAMS = (
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    )

    def __init__(self, args: ModelArgs, backend: AttentionBackend, *, tp_rank: int = 0, tp_size: int = 1,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        tp = {"tp_rank": tp_rank, "tp_size": tp_size, "dtype": dtype}
        self.args = args
        self.model = LlamaModel(args, backend, **tp)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, **tp)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        attention = self.model.layers[0].self_attn
        self.num_layers = args.num_layers
        self.num_kv_heads = attention.num_kv_heads        # per rank
        self.head_dim = args.head_dim
        self.dtype = dtype
        self.activation_dtype = dtype
        self.cpu_decode = None          # engine/models/cpu_decode.CpuDecode, set by enable_cpu_decode()

    def enable_cpu_decode(self) -> str | None:
        """Run pure-decode steps through the fused C path where it applies (engine/models/cpu_decode.py);
        returns why not otherwise."""
        from engine.models.cpu_decode import CpuDecode, unsupported_reason

        reason = unsupported_reason(self)
        self.cpu_decode = CpuDecode(self) if reason is None else None
        return reason

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                metadata: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] int64 -> hidden states [T, hidden] (in activation_dtype)."""
        if self.cpu_decode is not None and self.cpu_decode.can_run(metadata, input_ids, kv_caches):
            return self.cpu_decode(input_ids, positions, kv_caches, metadata)
        widen = self.activation_dtype if self.activation_dtype != self.dtype else None
        return self.model(input_ids, positions, kv_caches, metadata, widen)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] -> float32 logits [S, vocab], the same on every rank."""
        return self.lm_head(hidden)
