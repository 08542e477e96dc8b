"""The `triton` attention backend (the default on CUDA): writes the step's keys and values into the paged
cache, then attends with the split-K decode kernel for a pure-decode batch (the CUDA-graph case) and with
the mixed-batch kernel otherwise. Nothing here reads a device value, so no step pays a host sync.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionBackend, AttentionMetadata
from kernels.triton_decode_attention import paged_decode_attention_triton
from kernels.triton_kv_cache import write_kv_cache_triton
from kernels.triton_paged_attention import paged_attention_triton


class TritonAttention(AttentionBackend):
    name = "triton"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        write_kv_cache_triton(key, value, key_cache, value_cache, metadata.slot_mapping)
        if not metadata.is_pure_decode:
            return paged_attention_triton(
                query, key_cache, value_cache, metadata.query_start_loc, metadata.seq_lens,
                metadata.block_tables, scale,
            )
        # pure decode: request r's token is row r (query_start_loc is 0..R); rows past R are padding
        num_seqs = metadata.seq_lens.shape[0]
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if query.shape[0] > num_seqs:
            out[num_seqs:].zero_()
        paged_decode_attention_triton(
            query[:num_seqs], key_cache, value_cache, metadata.seq_lens, metadata.block_tables, scale,
            out=out[:num_seqs],
        )
        return out
