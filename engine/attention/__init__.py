"""Attention backends behind one interface (DESIGN §5).

A backend writes the step's new keys and values into the layer's paged cache by slot_mapping, then
attends the step's queries against the cache. `torch` (the references in kernels/) is the CPU path;
`triton` is the default on CUDA. Metadata describes one flattened batch of mixed prefill chunks and decode
tokens; its tensors live on the model's device (CUDA-graph replay reuses them in place).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor       # int64 [T]: cache slot of each new token (-1: padding, skipped)
    query_start_loc: torch.Tensor    # int32 [R + 1]
    seq_lens: torch.Tensor           # int32 [R]: tokens in the cache once this step's are written
    block_tables: torch.Tensor       # int32 [R, max_blocks]
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int           # T without padding
    # some request computes prompt tokens this step (its first pass, the rest after a prefix-cache hit, or a
    # recompute): on the CPU those take the eager path, so a prompt's logits do not depend on what was cached
    prefill: bool = False

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend:
    name = "base"

    def forward(
        self,
        query: torch.Tensor,          # [T, Hq, D]
        key: torch.Tensor,            # [T, Hk, D]
        value: torch.Tensor,          # [T, Hk, D]
        kv_cache: torch.Tensor,       # [2, num_blocks, block_size, Hk, D]
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:                # [T, Hq, D]
        raise NotImplementedError


class TorchAttention(AttentionBackend):
    """The CPU path. Over a 16-bit cache, kernels/cpu/ops's attention runs where it can (it reads the paged
    cache in place: decode rows, and prefill chunks as one decode row per query token); everything else
    goes to the torch reference."""

    name = "torch"

    def __init__(self) -> None:
        from kernels.cpu import ops as cpu_ops

        self.cpu_kernels = cpu_ops if cpu_ops.available() else None

    def forward(self, query, key, value, kv_cache, metadata, scale):
        from kernels import paged_attention_torch, write_kv_cache_torch

        write_kv_cache_torch(key, value, kv_cache[0], kv_cache[1], metadata.slot_mapping)
        fast = self.cpu_kernels
        if fast is not None and not query.is_cuda and fast.supports_attention(kv_cache[0], query.shape[1]):
            if metadata.is_pure_decode:
                return fast.paged_decode_attention16(query, kv_cache[0], kv_cache[1], metadata.seq_lens,
                                                     metadata.block_tables, scale)
            return fast.paged_attention16(query, kv_cache[0], kv_cache[1], metadata.query_start_loc,
                                          metadata.seq_lens, metadata.block_tables, scale)
        return paged_attention_torch(
            query, kv_cache[0], kv_cache[1], metadata.query_start_loc, metadata.seq_lens,
            metadata.block_tables, scale,
        )


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchAttention()
    if name == "triton":
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention()
    raise ValueError(f"unknown attention backend {name!r} (choose torch or triton)")
