"""Builds one flattened batch for the paged attention tests: requests with a cached context (prefix hit or
earlier steps) and new query tokens, their block tables over shuffled blocks of a random-filled cache.

Only the context is written into the caches; the new tokens' keys and values come separately with their
slot_mapping, as an attention backend receives them. Every cache slot a request does not own holds random
values, so a kernel that reads a wrong block or a key past seq_len shows up in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from kernels.kv_cache import write_kv_cache_torch


@dataclass
class PagedBatch:
    query: torch.Tensor            # [T, Hq, D], T = sum(query_lens) + padding_tokens
    key: torch.Tensor              # [T, Hk, D] new keys
    value: torch.Tensor
    slot_mapping: torch.Tensor     # int64 [T], -1 for padding tokens
    key_cache: torch.Tensor        # [num_blocks, block_size, Hk, D], context written
    value_cache: torch.Tensor
    query_start_loc: torch.Tensor  # int32 [R + 1]
    seq_lens: torch.Tensor         # int32 [R]
    block_tables: torch.Tensor     # int32 [R, max_blocks], unused entries 0 (the null block)
    scale: float

    def write_new_tokens(self) -> None:
        """Put the new tokens' keys and values in the cache (what a backend does before attending)."""
        write_kv_cache_torch(self.key, self.value, self.key_cache, self.value_cache, self.slot_mapping)

    def to(self, device: str | torch.device) -> PagedBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **{name: tensor.to(device) for name, tensor in moved.items()})

    @property
    def kv_cache(self) -> torch.Tensor:
        """The [2, num_blocks, block_size, Hk, D] layout an attention backend is given (a copy)."""
        return torch.stack([self.key_cache, self.value_cache])


def make_paged_batch(
    query_lens: list[int],
    context_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    padding_tokens: int = 0,
    seed: int = 0,
) -> PagedBatch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_needed) + 1                   # a spare column of null entries
    num_blocks = 1 + sum(blocks_needed) + 3               # block 0 is the null block; a few never used
    owned = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for r, count in enumerate(blocks_needed):
        block_tables[r, :count] = torch.tensor(owned[:count], dtype=torch.int32)
        del owned[:count]

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    key_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)
    value_cache = randn(num_blocks, block_size, num_kv_heads, head_dim)

    def slots(r: int, positions: range) -> list[int]:
        return [int(block_tables[r, p // block_size]) * block_size + p % block_size for p in positions]

    context_slots = [s for r, c in enumerate(context_lens) for s in slots(r, range(c))]
    num_context = len(context_slots)
    write_kv_cache_torch(randn(num_context, num_kv_heads, head_dim), randn(num_context, num_kv_heads, head_dim),
                         key_cache, value_cache, torch.tensor(context_slots, dtype=torch.int64))

    new_slots = [s for r, (c, q) in enumerate(zip(context_lens, query_lens, strict=True)) for s in slots(r, range(c, c + q))]
    num_tokens = len(new_slots) + padding_tokens
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query=randn(num_tokens, num_heads, head_dim),
        key=randn(num_tokens, num_kv_heads, head_dim),
        value=randn(num_tokens, num_kv_heads, head_dim),
        slot_mapping=torch.tensor(new_slots + [-1] * padding_tokens, dtype=torch.int64),
        key_cache=key_cache,
        value_cache=value_cache,
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        scale=head_dim ** -0.5,
    )
