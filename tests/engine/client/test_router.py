"""The data-parallel router: prefix affinity, the load rule that overrides it, pins, round robin; and that
the frontend's prefix hashes are the scheduler's block hashes, bit for bit."""

from __future__ import annotations

import random

import pytest

from engine.block_hash import prefix_block_hashes
from engine.client.router import BUSIER_ABS, PREFIX_BLOCKS, Router, load_score
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.sampling_params import SamplingParams

BLOCK = 16


def prompt(prefix: int, suffix: int, prefix_len: int = 8 * BLOCK) -> list[int]:
    rng = random.Random(prefix)
    head = [rng.randrange(1, 1000) for _ in range(prefix_len)]
    return head + [1000 + suffix, 2000 + suffix, 3000 + suffix]


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_the_frontend_hashes_blocks_as_the_kv_cache_manager_does(salt):
    tokens = prompt(3, 0, prefix_len=5 * BLOCK + 7)
    manager = KVCacheManager(64, BLOCK)
    request = Request(1, tokens, SamplingParams(max_tokens=4).resolved(), [0], max_model_len=1024, cache_salt=salt)
    manager.hash_new_blocks(request)
    assert len(request.block_hashes) == 5
    assert prefix_block_hashes(tokens, BLOCK, salt) == request.block_hashes
    assert prefix_block_hashes(tokens, BLOCK, salt, max_blocks=2) == request.block_hashes[:2]
    assert prefix_block_hashes(tokens, BLOCK, "other") != request.block_hashes


def test_requests_sharing_a_prefix_go_to_one_engine_and_new_prefixes_spread():
    router = Router(2, BLOCK, "prefix")
    idle = [0, 0]
    first = {p: router.choose(prompt(p, 0), None, idle) for p in range(8)}
    assert sorted(first.values()).count(0) == 4          # idle engines share the new prefixes
    for p in range(8):
        for s in range(1, 6):
            # even when the prefix's engine is a little busier, the prefix wins
            scores = [3, 0] if first[p] == 0 else [0, 3]
            assert router.choose(prompt(p, s), None, scores) == first[p]


def test_a_much_busier_engine_loses_its_prefix_to_load():
    router = Router(2, BLOCK, "prefix")
    home = router.choose(prompt(1, 0), None, [0, 0])
    other = 1 - home
    busy = [0, 0]
    busy[home] = BUSIER_ABS * 3
    assert router.choose(prompt(1, 1), None, busy) == other
    # the prefix followed the request: its next one goes there even when both are idle
    assert router.choose(prompt(1, 2), None, [0, 0]) == other


def test_a_salt_is_a_different_prefix():
    router = Router(2, BLOCK, "prefix")
    a = router.choose(prompt(1, 0), "a", [0, 0])
    b = router.choose(prompt(1, 0), "b", [0, 0])
    assert a != b                                          # no shared prefix: the idle tie goes elsewhere


def test_pins_are_honoured_and_move_the_prefix():
    router = Router(3, BLOCK, "prefix")
    assert router.pinned(2, prompt(5, 0), None) == 2
    assert router.choose(prompt(5, 1), None, [0, 0, 0]) == 2
    with pytest.raises(ValueError, match="rank 3"):
        router.pinned(3, prompt(5, 0), None)


def test_load_and_round_robin_policies_ignore_prefixes():
    rr = Router(3, BLOCK, "round_robin")
    assert [rr.choose(prompt(1, 0), None, [9, 0, 0]) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    load = Router(3, BLOCK, "load")
    assert load.choose(prompt(1, 0), None, [load_score(2, 1), load_score(0, 5), load_score(1, 0)]) == 2


def test_short_prompts_without_a_full_block_are_routed_by_load():
    router = Router(2, BLOCK, "prefix")
    assert router.choose([1, 2, 3], None, [5, 1]) == 1
    assert not router.owner


def test_the_prefix_memory_is_bounded():
    router = Router(2, BLOCK, "prefix", capacity_blocks=40)
    for p in range(50):
        router.choose(prompt(p, 0, prefix_len=PREFIX_BLOCKS * BLOCK), None, [0, 0])
    assert len(router.owner) == 40
