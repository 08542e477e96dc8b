"""Pure-decode steps of a 16-bit Llama-family model on an AVX2 CPU in one C call (kernels/cpu/ops's
`decode_forward16`).

At one to a few dozen rows a decode step reads every weight once and does little arithmetic per byte, so
what the eager torch path adds around its matmuls (about sixty small tensor operations a layer, each a
dispatch and an allocation) cost as much as the matmuls themselves on the project's 2-core machine. This
path runs RMSNorm, the QKV product, q/k norms, RoPE, the cache write, decode attention, the output
projection, the residual adds and the SwiGLU MLP of every layer in C, in float32 over the 16-bit weights
and cache: the arithmetic of the eager CPU path (engine/layers/cpu_matmul.py), ordered the same way, so it
agrees with it to float32 rounding (tests/engine/models/test_cpu_decode.py; the equivalence tests against
transformers run through it). Long prefill chunks keep the eager path: they are bound by arithmetic,
where the per-op overhead is small next to the GEMMs.

Several query tokens per request (speculative decoding's verify steps: up to MAX_QUERY_TOKENS a request, and
max_rows() in all) take this path too, as one row per token: each row attends causally to
its request's cache up to itself (its own length and a copy of its request's block-table row), the way
kernels/cpu/ops.paged_attention16 runs prefill chunks. decode_forward16 writes every row's keys and values
before any row attends, so a draft sees the drafts before it. The C call is unchanged; only its inputs are
expanded here. Steps that compute prompt tokens do not (AttentionMetadata.prefill): a GGUF's quantized
matmuls here take 8-bit activations, which move its logits more than the eager path's exact weights do, and a
prompt prefilled here after a prefix-cache hit but eagerly when cold would get its first token from either.

Used when: kernels/cpu/ops runs here, the model is 16-bit with float32 activations (the upcast CPU path),
one rank, no output/MLP biases, and the decode attention kernel takes the cache layout. Matmul weights kept
in a GGUF file's quantized blocks go to kernels/cpu/quant's gemm_q inside the same call.
RINGSERVE_CPU_FUSED_DECODE=0 turns it off (the eager path runs: for comparisons).
"""

from __future__ import annotations

import logging
import os

import torch

from engine.attention import AttentionMetadata
from engine.layers.cpu_matmul import gemm16_max_rows
from kernels.cpu import ops as cpu_ops

logger = logging.getLogger(__name__)

# Rows above this go to the eager path: its float32 GEMMs over the exact fp32 weight copies are faster
# once the step is bound by arithmetic rather than by reading the weights. Where gemm16 runs its AVX-512
# tiles it takes more rows than that (engine/layers/cpu_matmul.gemm16_max_rows), and so does this path:
# SmolLM2 decode steps on Zen 4 of 64 / 128 / 256 requests took ~82 / 161 / 331 ms here against ~89 / 172 /
# 349 ms eager.
MAX_ROWS = 64
# Steps with up to this many tokens per request run here (a verify step has 1 + num_speculative_tokens).
MAX_QUERY_TOKENS = 33


def max_rows() -> int:
    return max(MAX_ROWS, gemm16_max_rows())


def unsupported_reason(model) -> str | None:
    """Why `model` (a LlamaForCausalLM) cannot use this path here, or None when it can."""
    args = model.args
    if os.environ.get("RINGSERVE_CPU_FUSED_DECODE", "1") == "0":
        return "RINGSERVE_CPU_FUSED_DECODE=0"
    if not cpu_ops.available():
        return "kernels/cpu/ops does not run here"
    if model.dtype not in cpu_ops.SUPPORTED or model.activation_dtype != torch.float32:
        return "not a 16-bit model with float32 activations"
    if model.model.layers[0].self_attn.qkv_proj.num_heads != args.num_heads:
        return "tensor parallel"
    if args.o_bias or args.mlp_bias:
        return "output or MLP biases"
    group = args.num_heads // args.num_kv_heads
    if (args.num_heads % args.num_kv_heads or group > cpu_ops.MAX_GROUP or args.head_dim % 8
            or args.head_dim > cpu_ops.MAX_HEAD_DIM):
        return "head layout the decode attention kernel does not take"
    return None


class CpuDecode:
    """Runs a LlamaForCausalLM's pure-decode steps through cpu_ops.DecodeStack; built per KV cache."""

    def __init__(self, model) -> None:
        self.model = model
        self._stack: cpu_ops.DecodeStack | None = None
        self.disabled: str | None = None        # why the stack could not be built (the eager path runs)

    def can_run(self, metadata: AttentionMetadata, input_ids: torch.Tensor, kv_caches: list[torch.Tensor]) -> bool:
        # Prompt tokens go eagerly: its exact weights and float32 sums, where this path takes 8-bit activations
        # (a GGUF's logits move by ~0.5 here); prefilled here after a prefix-cache hit and eagerly when cold,
        # a prompt's first token would hang on what was cached (a near-tie flips).
        if (self.disabled is not None or metadata.prefill or metadata.max_query_len > MAX_QUERY_TOKENS
                or input_ids.is_cuda or not 0 < len(input_ids) <= max_rows()
                or len(input_ids) != metadata.num_actual_tokens):
            return False
        stack = self._stack
        if stack is None or any(a is not b for a, b in zip(stack.kv_caches, kv_caches, strict=True)):
            try:
                self._stack = self._build(kv_caches)
            except ValueError as exc:          # a layout the kernels do not take: the eager path is exact
                self.disabled = str(exc)
                logger.warning("pure-decode steps run eagerly: %s", exc)
                return False
        return True

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                 metadata: AttentionMetadata) -> torch.Tensor:
        """Only after can_run() said yes for these inputs and caches."""
        hidden = self.model.model.embed_tokens(input_ids).to(torch.float32)
        seq_lens, block_tables = metadata.seq_lens, metadata.block_tables
        if not metadata.is_pure_decode:
            seq_lens, block_tables = cpu_ops.per_token_rows(metadata.query_start_loc, metadata.seq_lens,
                                                            metadata.block_tables)
        return self._stack(hidden, positions, metadata.slot_mapping, seq_lens, block_tables)

    def _build(self, kv_caches: list[torch.Tensor]) -> cpu_ops.DecodeStack:
        inner, args = self.model.model, self.model.args
        layers = []
        for layer, kv_cache in zip(inner.layers, kv_caches, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            layers.append({
                "input_norm": layer.input_layernorm.weight.data,
                "qkv": _matmul_weight(attn.qkv_proj),
                "qkv_bias": None if attn.qkv_proj.bias is None else attn.qkv_proj.bias.data,
                "q_norm": attn.q_norm.weight.data if attn.qk_norm else None,
                "k_norm": attn.k_norm.weight.data if attn.qk_norm else None,
                "o_proj": _matmul_weight(attn.o_proj),
                "post_norm": layer.post_attention_layernorm.weight.data,
                "gate_up": _matmul_weight(mlp.gate_up_proj),
                "down": _matmul_weight(mlp.down_proj),
                "kv_cache": kv_cache,
            })
        return cpu_ops.DecodeStack(
            layers, inner.norm.weight.data, inner.rotary_emb.cos_sin_cache, num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads, head_dim=args.head_dim, eps=args.rms_norm_eps,
            scale=args.head_dim**-0.5,
        )


def _matmul_weight(layer):
    """A matmul layer's weight as the C step reads it: its GGUF blocks when it keeps them, else the 16-bit
    tensor."""
    return layer.qweight if layer.qweight is not None else layer.weight.data
