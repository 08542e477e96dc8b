"""The KV block pool: every block of the paged KV cache, created once, with ref counts and a free list.

Free blocks sit in a doubly linked list in eviction order (least recently freed first). A free block may
still hold a cached prefix (it keeps its hash); it stays findable until it is handed out again, and only
then is its hash dropped (lazy eviction). A prefix-cache hit on a free block "touches" it: the block leaves
the free list in O(1). Block 0 is the null block, never handed out, so executors can use it as padding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from engine.block_hash import external_block_hash
from engine.core.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None      # set while the block is in the prefix cache
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "uncached"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}, {cached})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: pop from the head, append at the tail, remove anywhere, all O(1).

    The links live in the blocks themselves (no node objects); two sentinels spare the edge cases.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("no free KV cache block left")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"{block} is already in the free queue")
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[1:])
        self.null_block = self.blocks[0]
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock] = {}
        self.kv_events: list | None = None      # KV-cache events since the last step, when they are on

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out, including free ones that still hold a cached prefix."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) held by requests."""
        return 1.0 - self.free_block_queue.num_free_blocks / (self.num_blocks - 1)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take blocks from the head of the free list, evicting their cached prefix if they hold one."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(f"asked for {num_blocks} KV blocks but only {queue.num_free_blocks} are free")
        blocks = []
        for _ in range(num_blocks):
            block = queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference to blocks found in the prefix cache; a free one leaves the free list."""
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; blocks that reach zero join the free list in the given
        order, so the first given is the first evicted."""
        queue = self.free_block_queue
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"{block} freed more often than it was taken (double free)")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                queue.append(block)

    # ------------------------------------------------------------------ prefix cache
    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> bool:
        """Register a full, computed block under its hash; True if it entered the cache. When another
        block already holds the same content (two requests computed it at once), the first keeps the
        entry and this one stays uncached, to be recycled as a plain block."""
        if block.block_hash is None and block_hash not in self.cached_block_hash_to_block:
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
            return True
        return False

    def _evict(self, block: KVCacheBlock) -> None:
        del self.cached_block_hash_to_block[block.block_hash]
        if self.kv_events is not None:
            self.kv_events.append(BlockRemoved(block_hashes=[external_block_hash(block.block_hash)],
                                               medium=MEDIUM_GPU))
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix. Refused (False) while any request holds blocks, as vLLM does:
        their tables would point at blocks whose hashes the cache no longer knows."""
        if self.free_block_queue.num_free_blocks != self.num_blocks - 1:
            return False
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.kv_events is not None:
            self.kv_events.append(AllBlocksCleared())
        return True
