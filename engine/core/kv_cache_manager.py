"""The KV cache manager: block tables per request over the block pool, with prefix caching.

Prefix caching (on by default) names each full block of a request's tokens by a chained sha256:
hash(parent block's hash, the block's token ids, extra keys), where the extra keys of the first block
hold the cache_salt, so the salt flows down the whole chain and different salts never share a block.
A block enters the cache only once its keys and values are computed (a block scheduled but then
preempted before it ran must never be found), and leaves it lazily, when the free list hands it out again.

Block tables grow at the end: a request gains blocks while it runs and gives all of them back at once
(finish, abort, preemption), tail first, so that the prefix, the most shareable part, is evicted last. The
one cut is speculative decoding's: blocks that held only rejected draft tokens go back at once (free_tail).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from engine.block_hash import (
    NO_EXTRA_KEYS,
    ROOT_BLOCK_HASH,
    external_block_hash,
    hash_block_tokens,
    salt_extra_keys,
)
from engine.core.block_pool import BlockPool, KVCacheBlock
from engine.core.kv_events import MEDIUM_GPU, BlockStored
from engine.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.prefix_cache_queries = 0      # tokens looked up, counted when a request gets its blocks
        self.prefix_cache_hits = 0         # tokens found

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    # ------------------------------------------------------------------ block hashes
    def hash_new_blocks(self, request: Request) -> None:
        """Extend request.block_hashes over every full block of its known tokens.

        Called once for the prompt and then each time a sampled token fills a block, so a request's
        tokens are hashed once in its life.
        """
        if not self.enable_caching:
            return
        size = self.block_size
        hashes = request.block_hashes
        start = len(hashes)
        end = len(request.all_token_ids) // size
        if end <= start:
            return
        data = array("i", request.all_token_ids[start * size: end * size]).tobytes()
        parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
        width = 4 * size
        for i in range(end - start):
            extra = salt_extra_keys(request.cache_salt) if start + i == 0 else NO_EXTRA_KEYS
            parent = hash_block_tokens(parent, data[i * width: (i + 1) * width], extra)
            hashes.append(parent)

    # ------------------------------------------------------------------ allocation
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a request about to be scheduled: (blocks, number of tokens).

        The hit never covers the last token: the model must run on it to produce the next logits.
        """
        if not self.enable_caching or request.skip_prefix_cache:
            return [], 0
        max_blocks = (len(request.all_token_ids) - 1) // self.block_size
        cached = self.block_pool.cached_block_hash_to_block
        blocks = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> Sequence[KVCacheBlock] | None:
        """Make room for num_new_tokens more tokens after the computed ones (and after the prefix-cache
        hits in new_computed_blocks, which are taken first).

        Returns the blocks appended to the request's table (the hits, then the new blocks), an empty
        tuple when its last block still has room, or None, changing nothing, when the free blocks do
        not suffice. Full blocks computed by earlier steps are entered into the prefix cache on the way
        (the scheduler also does so as soon as a step's results come back).
        """
        size = self.block_size
        blocks = request.blocks
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * size
        num_required = cdiv(num_computed + num_new_tokens, size)
        if num_required <= len(blocks) and not new_computed_blocks:
            return ()
        num_new_blocks = num_required - len(blocks) - len(new_computed_blocks)
        pool = self.block_pool
        # A hit on a free block takes that block off the free list, so it is not there to hand out.
        num_free_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > pool.num_free_blocks - num_free_hits:
            return None

        if self.enable_caching:
            self.cache_computed_blocks(request)
            if not blocks and not request.skip_prefix_cache:
                self.prefix_cache_queries += len(request.all_token_ids)
                self.prefix_cache_hits += len(new_computed_blocks) * size
        if new_computed_blocks:
            pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            request.num_cached_blocks += len(new_computed_blocks)
        new_blocks = pool.get_new_blocks(max(num_new_blocks, 0))
        blocks.extend(new_blocks)
        return [*new_computed_blocks, *new_blocks] if new_computed_blocks else new_blocks

    def free(self, request: Request) -> None:
        """Give back all of a request's blocks, tail first; its computed full blocks stay cached."""
        self.cache_computed_blocks(request)
        self.block_pool.free_blocks(reversed(request.blocks))
        request.blocks = []
        request.num_cached_blocks = 0

    def free_tail(self, request: Request, num_kept: int) -> bool:
        """Give back the request's blocks past its first num_kept (slots of rejected draft tokens: never
        computed for real, so never cached), last first; True when any went back."""
        blocks = request.blocks
        if len(blocks) <= num_kept:
            return False
        self.block_pool.free_blocks(reversed(blocks[num_kept:]))
        del blocks[num_kept:]
        return True

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def cache_computed_blocks(self, request: Request) -> None:
        """Enter the request's full blocks whose keys and values are computed into the prefix cache."""
        if not self.enable_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        start = request.num_cached_blocks
        if num_full <= start:
            return
        cache_block = self.block_pool.cache_block
        blocks, hashes = request.blocks[start:num_full], request.block_hashes[start:num_full]
        if self.block_pool.kv_events is None:
            for block, block_hash in zip(blocks, hashes, strict=True):
                cache_block(block, block_hash)
        else:
            stored = [cache_block(block, block_hash) for block, block_hash in zip(blocks, hashes, strict=True)]
            self._report_stored(request, start, stored)
        request.num_cached_blocks = num_full

    def enable_kv_events(self) -> None:
        """Start collecting KV-cache events (engine.core.kv_events); take them with take_kv_events."""
        self.block_pool.kv_events = []

    def take_kv_events(self) -> list:
        events = self.block_pool.kv_events
        if not events:
            return []
        self.block_pool.kv_events = []
        return events

    def _report_stored(self, request: Request, start: int, stored: list[bool]) -> None:
        """One BlockStored per run of consecutive blocks that entered the cache (a block whose content
        another block already caches breaks a run: the cache gained nothing there)."""
        size = self.block_size
        hashes = request.block_hashes
        i = 0
        while i < len(stored):
            if not stored[i]:
                i += 1
                continue
            j = i
            while j < len(stored) and stored[j]:
                j += 1
            first, end = start + i, start + j
            self.block_pool.kv_events.append(BlockStored(
                block_hashes=[external_block_hash(h) for h in hashes[first:end]],
                parent_block_hash=external_block_hash(hashes[first - 1]) if first else None,
                token_ids=request.all_token_ids[first * size:end * size], block_size=size, lora_id=None,
                medium=MEDIUM_GPU,
            ))
            i = j
