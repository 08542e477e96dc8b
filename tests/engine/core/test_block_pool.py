"""The KV block pool: free list order, ref counts, the null block, lazy eviction of cached blocks."""

from __future__ import annotations

import pytest

from engine.core.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue]


def test_free_queue_pops_in_order_and_removes_from_the_middle():
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.append(blocks[2])
    queue.append(blocks[0])
    assert [b.block_id for b in queue] == [1, 3, 4, 2, 0]
    assert len(queue) == 5


def test_free_queue_rejects_double_insert_and_removing_an_absent_block():
    blocks = [KVCacheBlock(i) for i in range(2)]
    queue = FreeKVCacheBlockQueue(blocks)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])
    queue.remove(blocks[1])
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(blocks[1])


def test_free_queue_popleft_on_empty_raises():
    queue = FreeKVCacheBlockQueue([])
    with pytest.raises(IndexError, match="no free KV cache block"):
        queue.popleft()


def test_null_block_is_reserved():
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0
    assert pool.num_free_blocks == 3
    handed = pool.get_new_blocks(3)
    assert [b.block_id for b in handed] == [1, 2, 3]
    assert pool.usage == 1.0


def test_pool_needs_a_usable_block():
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_asking_for_more_blocks_than_free_raises_and_takes_nothing():
    pool = BlockPool(3)
    with pytest.raises(ValueError, match="only 2 are free"):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2


def test_ref_counts_and_free_order():
    pool = BlockPool(6)
    a = pool.get_new_blocks(3)                 # blocks 1, 2, 3
    pool.touch(a[:2])                          # a second owner of 1 and 2
    assert [b.ref_cnt for b in a] == [2, 2, 1]
    pool.free_blocks(reversed(a))              # first owner gives back, tail first
    assert free_ids(pool) == [4, 5, 3]         # only 3 reached zero
    pool.free_blocks(reversed(a[:2]))
    assert free_ids(pool) == [4, 5, 3, 2, 1]
    assert all(b.ref_cnt == 0 for b in a)


def test_double_free_is_an_error():
    pool = BlockPool(3)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(ValueError, match="double free"):
        pool.free_blocks([block])


def test_touching_a_free_cached_block_takes_it_off_the_free_list():
    pool = BlockPool(4)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, b"h" * 32)
    pool.free_blocks([block])
    assert block.block_id in free_ids(pool)
    assert pool.get_cached_block(b"h" * 32) is block
    pool.touch([block])
    assert block.ref_cnt == 1
    assert block.block_id not in free_ids(pool)
    assert pool.num_free_blocks == 2


def test_reusing_a_cached_free_block_evicts_its_hash():
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    pool.cache_block(block, b"x" * 32)
    pool.free_blocks([block])
    (again,) = pool.get_new_blocks(1)
    assert again is block
    assert block.block_hash is None
    assert pool.get_cached_block(b"x" * 32) is None


def test_a_second_block_with_the_same_content_stays_uncached():
    pool = BlockPool(3)
    first, second = pool.get_new_blocks(2)
    pool.cache_block(first, b"same" * 8)
    pool.cache_block(second, b"same" * 8)
    assert pool.get_cached_block(b"same" * 8) is first
    assert second.block_hash is None


def test_reset_prefix_cache_only_when_no_block_is_held():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.cache_block(blocks[0], b"a" * 32)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"a" * 32) is blocks[0]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"a" * 32) is None
    assert blocks[0].block_hash is None
