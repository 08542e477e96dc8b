"""The KV cache manager: chained block hashes, prefix-cache hits, allocation, freeing and eviction order."""

from __future__ import annotations

from engine.core.kv_cache_manager import ROOT_BLOCK_HASH, KVCacheManager, hash_block_tokens
from engine.core.request import Request
from engine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=8).resolved()


def make_request(req: int, tokens: list[int], *, cache_salt: str | None = None,
                 params: SamplingParams = PARAMS) -> Request:
    return Request(req, tokens, params, [0], max_model_len=1024, cache_salt=cache_salt)


def add(manager: KVCacheManager, req: int, tokens: list[int], **kwargs) -> Request:
    request = make_request(req, tokens, **kwargs)
    manager.hash_new_blocks(request)
    return request


def schedule_prompt(manager: KVCacheManager, request: Request) -> tuple[list[int], int]:
    """What the scheduler does for a waiting request: look up hits, allocate, and once the step ran, mark
    the prompt computed and cache its full blocks. Returns (block ids of the hits, number of hit tokens)."""
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    hit_ids = [b.block_id for b in hits]
    assert manager.allocate_slots(request, request.num_tokens - num_hit_tokens, hits) is not None
    request.num_computed_tokens = request.num_tokens
    manager.cache_computed_blocks(request)
    return hit_ids, num_hit_tokens


def decode_one(manager: KVCacheManager, request: Request, token: int) -> list[int]:
    """Append a sampled token, then schedule it as the next step does; returns the new block ids."""
    request.all_token_ids.append(token)
    if request.num_tokens % manager.block_size == 0:
        manager.hash_new_blocks(request)
    new_blocks = manager.allocate_slots(request, 1)
    assert new_blocks is not None
    request.num_computed_tokens += 1
    manager.cache_computed_blocks(request)
    return [b.block_id for b in new_blocks]


def table(request: Request) -> list[int]:
    return [b.block_id for b in request.blocks]


def free_queue(manager: KVCacheManager) -> list[int]:
    return [b.block_id for b in manager.block_pool.free_block_queue]


def test_prefix_caching_timeline_from_vllm_design_doc():
    """vLLM's prefix-caching design doc walks 10 blocks of 4 tokens (ids 0-9) through six moments.
    Our pool reserves block 0 as the null block, so the example's pool is built here with 11 blocks and
    the example's block k is our block k + 1; every list below is the doc's list plus one.

    1. request 0 (15 prompt tokens) gets example blocks 0-3; 2. it decodes two tokens: the first fills
    block 3 (cached once computed), the second needs block 4; 3. request 1 (14 prompt tokens, its first
    10 equal request 0's) hits blocks 0 and 1 (8 tokens: block 2 matches only 2 of 4) and gets 5 and 6;
    4. request 0 is freed: 4, 3, 2 join the free queue tail first (0 and 1 are still held by request 1);
    5. request 1 is freed: the queue reads 7-8-9-4-3-2-6-5-1-0; 6. request 2 (29 prompt tokens, first 12
    equal request 0's) hits 0, 1, 2, which leave the queue, and gets 7, 8, 9, 4 and 3 (3 evicted).
    """
    ours = lambda ids: [i + 1 for i in ids]          # noqa: E731  (example id -> our id)
    manager = KVCacheManager(num_blocks=11, block_size=4)
    base = list(range(100, 129))

    r0 = add(manager, 0, base[:15])
    assert schedule_prompt(manager, r0) == ([], 0)
    assert table(r0) == ours([0, 1, 2, 3])
    assert decode_one(manager, r0, 500) == []        # fills block 3
    assert decode_one(manager, r0, 501) == ours([4])
    block3 = r0.blocks[3]
    assert manager.block_pool.get_cached_block(r0.block_hashes[3]) is block3

    r1 = add(manager, 1, base[:10] + [900, 901, 902, 903])
    hit_ids, num_hit_tokens = schedule_prompt(manager, r1)
    assert (hit_ids, num_hit_tokens) == (ours([0, 1]), 8)
    assert table(r1) == ours([0, 1, 5, 6])
    assert free_queue(manager) == ours([7, 8, 9])

    manager.free(r0)
    assert free_queue(manager) == ours([7, 8, 9, 4, 3, 2])
    manager.free(r1)
    assert free_queue(manager) == ours([7, 8, 9, 4, 3, 2, 6, 5, 1, 0])

    r2 = add(manager, 2, base[:12] + list(range(700, 717)))
    hit_ids, num_hit_tokens = schedule_prompt(manager, r2)
    assert (hit_ids, num_hit_tokens) == (ours([0, 1, 2]), 12)
    assert table(r2) == ours([0, 1, 2, 7, 8, 9, 4, 3])
    assert manager.block_pool.get_cached_block(r0.block_hashes[3]) is None     # block 3 was evicted
    assert block3.block_hash is None
    assert free_queue(manager) == ours([6, 5])


def test_block_hashes_chain_over_parent_tokens_and_salt():
    manager = KVCacheManager(num_blocks=8, block_size=2)
    request = add(manager, 0, [1, 2, 1, 2, 3])
    first = hash_block_tokens(ROOT_BLOCK_HASH, bytes([1, 0, 0, 0, 2, 0, 0, 0]))
    assert request.block_hashes[0] == first
    # The same two tokens in the second block hash differently: the parent is part of the hash.
    assert len(request.block_hashes) == 2
    assert request.block_hashes[1] != first
    assert request.block_hashes[1] == hash_block_tokens(first, bytes([1, 0, 0, 0, 2, 0, 0, 0]))
    salted = add(manager, 1, [1, 2, 1, 2, 3], cache_salt="tenant-a")
    assert salted.block_hashes[0] != first and salted.block_hashes[1] != request.block_hashes[1]


def test_incremental_hashing_equals_hashing_all_tokens_at_once():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    grown = add(manager, 0, [5, 6, 7])
    for token in [8, 9, 10, 11, 12, 13]:
        grown.all_token_ids.append(token)
        manager.hash_new_blocks(grown)
    whole = add(manager, 1, [5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert grown.block_hashes == whole.block_hashes
    assert len(whole.block_hashes) == 2


def test_a_hit_never_covers_the_last_prompt_token():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(1, 9))                       # exactly two full blocks
    r0 = add(manager, 0, prompt)
    schedule_prompt(manager, r0)
    manager.free(r0)
    r1 = add(manager, 1, prompt)
    assert schedule_prompt(manager, r1) == ([1], 4)     # 4 of 8 tokens, though both blocks are cached


def test_blocks_are_cached_only_once_computed():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(1, 10))
    r0 = add(manager, 0, prompt)
    assert manager.allocate_slots(r0, 9) is not None  # scheduled, but its step has not run
    r1 = add(manager, 1, prompt)
    assert manager.get_computed_blocks(r1) == ([], 0)
    r0.num_computed_tokens = 9                       # the step ran
    manager.free(r0)
    blocks, num_tokens = manager.get_computed_blocks(r1)
    assert num_tokens == 8 and [b.block_id for b in blocks] == [1, 2]


def test_prompt_logprobs_requests_get_no_hits_but_still_fill_the_cache():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    prompt = list(range(1, 10))
    r0 = add(manager, 0, prompt)
    schedule_prompt(manager, r0)
    wants_logprobs = SamplingParams(max_tokens=4, prompt_logprobs=1).resolved()
    r1 = add(manager, 1, prompt, params=wants_logprobs)
    assert schedule_prompt(manager, r1) == ([], 0)
    manager.free(r0)
    r2 = add(manager, 2, prompt)
    assert schedule_prompt(manager, r2)[1] == 8


def test_cache_salt_isolates_prefix_hits():
    manager = KVCacheManager(num_blocks=32, block_size=4)
    prompt = list(range(1, 14))
    hits, tables = {}, {}
    for req, salt in enumerate([None, "a", "b", "a", None]):
        request = add(manager, req, prompt, cache_salt=salt)
        hits[req], _ = schedule_prompt(manager, request)
        tables[req] = table(request)
    assert hits[0] == hits[1] == hits[2] == []
    # Different salts (and no salt) never share a block.
    for a, b in [(0, 1), (1, 2), (0, 2), (0, 3), (2, 3), (1, 4), (2, 4)]:
        assert not set(tables[a]) & set(tables[b]), (a, b)
    # The same salt does share, and so does no salt with no salt.
    assert hits[3] == tables[1][:3]
    assert hits[4] == tables[0][:3]


def test_allocation_that_does_not_fit_changes_nothing():
    manager = KVCacheManager(num_blocks=4, block_size=4)     # 3 usable blocks
    prompt = list(range(1, 9))
    r0 = add(manager, 0, prompt)
    schedule_prompt(manager, r0)
    manager.free(r0)                                         # blocks 2, 1 stay cached, and free
    r1 = add(manager, 1, prompt + [50, 51, 52, 53, 54])      # 13 tokens: 2 hits + 2 new blocks
    hits, num_hit_tokens = manager.get_computed_blocks(r1)
    assert num_hit_tokens == 8
    # Three blocks are free, but two of them are the hits themselves: one is left for two new blocks.
    assert manager.allocate_slots(r1, 5, hits) is None
    assert manager.num_free_blocks == 3 and r1.blocks == [] and all(b.ref_cnt == 0 for b in hits)
    assert manager.prefix_cache_queries == 8 and manager.prefix_cache_hits == 0


def test_allocate_slots_returns_only_the_appended_blocks():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    r0 = add(manager, 0, [1, 2, 3])
    assert [b.block_id for b in manager.allocate_slots(r0, 3)] == [1]
    r0.num_computed_tokens = 3
    r0.all_token_ids.append(4)
    manager.hash_new_blocks(r0)
    assert manager.allocate_slots(r0, 1) == ()               # room left in block 1
    r0.num_computed_tokens = 4
    r0.all_token_ids.extend([5, 6])
    manager.hash_new_blocks(r0)
    assert [b.block_id for b in manager.allocate_slots(r0, 2)] == [2]
    assert table(r0) == [1, 2]


def test_prefix_cache_counters_count_tokens_once_per_scheduled_request():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    prompt = list(range(1, 11))
    schedule_prompt(manager, add(manager, 0, prompt))
    schedule_prompt(manager, add(manager, 1, prompt))
    assert manager.prefix_cache_queries == 20
    assert manager.prefix_cache_hits == 8


def test_disabled_prefix_caching_neither_hashes_nor_hits():
    manager = KVCacheManager(num_blocks=16, block_size=4, enable_caching=False)
    prompt = list(range(1, 11))
    r0 = add(manager, 0, prompt)
    assert r0.block_hashes == []
    schedule_prompt(manager, r0)
    manager.free(r0)
    assert schedule_prompt(manager, add(manager, 1, prompt)) == ([], 0)
    assert manager.block_pool.cached_block_hash_to_block == {}
    assert manager.prefix_cache_queries == 0


def test_usage_and_reset_prefix_cache():
    manager = KVCacheManager(num_blocks=5, block_size=4)
    r0 = add(manager, 0, list(range(1, 10)))
    schedule_prompt(manager, r0)
    assert manager.usage == 0.75 and manager.num_free_blocks == 1
    assert manager.reset_prefix_cache() is False
    manager.free(r0)
    assert manager.usage == 0.0
    assert manager.reset_prefix_cache() is True
    assert schedule_prompt(manager, add(manager, 1, list(range(1, 10)))) == ([], 0)
