"""The scheduler: the diff it sends, token budgets, chunked prefill, policies, preemption, validation."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, EngineConfig
from engine.core.scheduler import Scheduler
from engine.messages import HANDLE, TOKEN, AddRequest, ExecutorIn, pack, unpack
from engine.sampling_params import SamplingParams
from shm.codec import Codec
from tests.engine.fake_model import (
    add_request,
    check_block_accounting,
    make_scheduler,
    new_tokens,
    run_engine_loop,
    scheduled,
    step,
)


def slot_mapping(so, tables: dict[int, list[int]], block_size: int) -> list[int]:
    """What the executor computes from a step: slot = block_id * block_size + offset, per scheduled token."""
    slots = []
    handles = unpack(so.reqs, HANDLE).tolist()
    counts = unpack(so.num_scheduled_tokens, TOKEN).tolist()
    starts = unpack(so.num_computed_tokens, TOKEN).tolist()
    for handle, n, start in zip(handles, counts, starts, strict=True):
        for pos in range(start, start + n):
            slots.append(tables[handle][pos // block_size] * block_size + pos % block_size)
    return slots


def test_slot_mapping_example_from_vllm_design_doc():
    """vLLM's worked example: block_size 4, prompts of 5, 7 and 3 tokens, blocks 1-5 handed out in order
    (our pool's block 0 is the null block, so a fresh pool hands out 1, 2, 3, ... exactly as there).
    Prefill slots are [4..8, 12..18, 20..22]; the next decode step writes slots [9, 19, 23]."""
    scheduler, runner = make_scheduler(num_blocks=16, block_size=4)
    for req, length in enumerate([5, 7, 3]):
        add_request(scheduler, req, length)
    prefill, _ = step(scheduler, runner)
    tables = {new.req: unpack(new.block_ids, TOKEN).tolist() for new in prefill.new_reqs}
    assert tables == {0: [1, 2], 1: [3, 4], 2: [5]}
    assert slot_mapping(prefill, tables, 4) == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    decode, _ = step(scheduler, runner)
    assert decode.new_reqs == [] and decode.new_block_ids == []
    assert slot_mapping(decode, tables, 4) == [9, 19, 23]


def test_a_request_travels_in_full_once_then_as_a_diff():
    scheduler, runner = make_scheduler(block_size=4)
    add_request(scheduler, 7, 3, max_tokens=10)
    first, _ = step(scheduler, runner)
    (new,) = first.new_reqs
    assert new.req == 7 and unpack(new.prompt_token_ids, TOKEN).tolist() == [701, 702, 703]
    assert new.output_token_ids == b"" and new.num_computed_tokens == 0
    assert scheduled(first) == {7: 3}
    # Decode steps name the request and its counts only; a new block travels when the table grows.
    second, _ = step(scheduler, runner)                 # position 3: still block 1
    assert second.new_reqs == [] and second.new_block_ids == []
    assert unpack(second.num_computed_tokens, TOKEN).tolist() == [3]
    third, _ = step(scheduler, runner)                  # position 4: needs a second block
    assert [(h, unpack(ids, TOKEN).tolist()) for h, ids in third.new_block_ids] == [(7, [2])]


def test_long_prompts_are_chunked_and_sample_only_at_the_end():
    scheduler, runner = make_scheduler(block_size=4, max_num_batched_tokens=4)
    add_request(scheduler, 0, 10)
    chunks = []
    for _ in range(3):
        so, out = step(scheduler, runner)
        chunks.append((scheduled(so)[0], unpack(so.num_computed_tokens, TOKEN).tolist()[0], new_tokens(out)))
    assert [c[:2] for c in chunks] == [(4, 0), (4, 4), (2, 8)]
    assert chunks[0][2] == {} and chunks[1][2] == {}
    assert list(chunks[2][2]) == [0]


def test_long_prefill_token_threshold_lets_prompts_share_steps():
    """With the cap, two long prompts each take at most 5 tokens a step and run side by side (without it
    the first takes the whole budget of 16); a short prompt under the cap is not split."""
    scheduler, runner = make_scheduler(block_size=4, max_num_batched_tokens=16, long_prefill_token_threshold=5)
    add_request(scheduler, 0, 12)
    add_request(scheduler, 1, 12)
    add_request(scheduler, 2, 3)
    counts = [scheduled(step(scheduler, runner)[0]) for _ in range(3)]
    assert counts == [{0: 5, 1: 5, 2: 3}, {0: 5, 1: 5, 2: 1}, {0: 2, 1: 2, 2: 1}]
    result = run_engine_loop(scheduler, runner)
    assert set(result.finish_reasons) == {0, 1, 2}
    check_block_accounting(scheduler)


def test_negative_long_prefill_token_threshold_is_refused():
    with pytest.raises(ConfigError, match="long_prefill_token_threshold must be a non-negative integer"):
        EngineConfig(load_format="fake", long_prefill_token_threshold=-1).finalize()


def test_budget_goes_to_running_requests_first():
    scheduler, runner = make_scheduler(block_size=4, max_num_batched_tokens=6)
    add_request(scheduler, 0, 5)
    step(scheduler, runner)
    add_request(scheduler, 1, 12)
    so, _ = step(scheduler, runner)
    assert scheduled(so) == {0: 1, 1: 5}               # running decode first, the rest chunks the prompt
    assert so.total_num_scheduled_tokens == 6
    assert [new.req for new in so.new_reqs] == [1]


def test_max_num_seqs_caps_the_batch():
    scheduler, runner = make_scheduler(max_num_seqs=2)
    for req in range(3):
        add_request(scheduler, req, 3, max_tokens=2)
    so, _ = step(scheduler, runner)
    assert list(scheduled(so)) == [0, 1]
    assert scheduler.make_stats().num_waiting == 1
    step(scheduler, runner)                            # 0 and 1 finish (two tokens each)
    so, _ = step(scheduler, runner)
    assert list(scheduled(so)) == [2]


def order_of_first_schedule(policy: str, requests: list[tuple[int, int, float]]) -> list[int]:
    scheduler, runner = make_scheduler(max_num_seqs=1, scheduling_policy=policy)
    for req, priority, arrival in requests:
        add_request(scheduler, req, 2, max_tokens=1, priority=priority, arrival_time=arrival)
    order = []
    while scheduler.has_unfinished_requests():
        so, _ = step(scheduler, runner)
        order += [new.req for new in so.new_reqs]
    return order


def test_fcfs_runs_in_arrival_order_and_priority_by_value_then_arrival():
    requests = [(0, 5, 1.0), (1, 1, 2.0), (2, 5, 0.5), (3, 1, 3.0)]
    assert order_of_first_schedule("fcfs", requests) == [0, 1, 2, 3]
    assert order_of_first_schedule("priority", requests) == [1, 3, 2, 0]


def test_prefix_hit_is_reported_and_usable_the_step_after_the_prompt_ran():
    scheduler, runner = make_scheduler(block_size=4)
    shared = list(range(1, 13))
    add_request(scheduler, 0, shared + [50])
    _, out = step(scheduler, runner)
    assert out.first_scheduled[0][:2] == (0, 0)
    add_request(scheduler, 1, shared + [60, 61])
    so, out = step(scheduler, runner)
    new = so.new_reqs[0]
    assert new.num_computed_tokens == 12
    assert unpack(new.block_ids, TOKEN).tolist()[:3] == [1, 2, 3]
    assert scheduled(so)[1] == 2
    assert out.first_scheduled[0][:2] == (1, 12)
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (13 + 14, 12)


def test_preemption_frees_the_latest_request_and_resumes_it_with_its_tokens():
    # 6 usable blocks of 4 tokens: two requests of 8 prompt tokens that each grow to 20 cannot coexist.
    scheduler, runner = make_scheduler(num_blocks=7, block_size=4)
    add_request(scheduler, 0, 8, max_tokens=12, ignore_eos=True)
    add_request(scheduler, 1, 8, max_tokens=12, ignore_eos=True)
    preempted_at = resumed = None
    outputs = {0: [], 1: []}
    for i in range(60):
        so, out = step(scheduler, runner)
        check_block_accounting(scheduler)
        for h, t in new_tokens(out).items():
            outputs[h].append(t)
        if preempted_at is None and unpack(so.finished_reqs, HANDLE).tolist() == [1]:
            preempted_at = (i, list(outputs[1]))
            assert 1 not in scheduled(so)
        for new in so.new_reqs:
            if new.req == 1 and preempted_at is not None:
                resumed = new
        if not scheduler.has_unfinished_requests():
            break
    assert preempted_at is not None, "request 1 was never preempted"
    assert scheduler.num_preemptions >= 1
    # It comes back in full: its prompt, the tokens it had produced, a fresh block table.
    assert resumed is not None
    assert unpack(resumed.output_token_ids, TOKEN).tolist()[: len(preempted_at[1])] == preempted_at[1]
    assert len(unpack(resumed.block_ids, TOKEN)) >= 1
    # And it produces the same tokens as it does with room to spare.
    roomy, roomy_runner = make_scheduler(num_blocks=64, block_size=4)
    for req in (0, 1):
        add_request(roomy, req, 8, max_tokens=12, ignore_eos=True)
    reference = run_engine_loop(roomy, roomy_runner)
    assert outputs == reference.tokens
    assert scheduler.num_free_blocks == 6


def test_priority_policy_preempts_the_lowest_priority_even_if_it_runs_first():
    scheduler, runner = make_scheduler(num_blocks=7, block_size=4, scheduling_policy="priority")
    add_request(scheduler, 0, 8, max_tokens=12, ignore_eos=True, priority=9)   # runs first: alone
    step(scheduler, runner)
    add_request(scheduler, 1, 8, max_tokens=12, ignore_eos=True, priority=0)
    victims = []
    while scheduler.has_unfinished_requests():
        so, _ = step(scheduler, runner)
        victims += unpack(so.finished_reqs, HANDLE).tolist()
        if victims:
            break
    assert victims[0] == 0


def test_a_request_preempts_itself_when_it_is_the_lowest_priority():
    scheduler, runner = make_scheduler(num_blocks=5, block_size=4)   # 4 usable blocks
    add_request(scheduler, 0, 8, max_tokens=8, ignore_eos=True)      # blocks 1, 2
    add_request(scheduler, 1, 4, max_tokens=8, ignore_eos=True)      # block 3
    step(scheduler, runner)
    # Both need a block now; request 0 takes the last one, request 1 (last in running) finds none.
    so, _ = step(scheduler, runner)
    assert scheduled(so) == {0: 1}
    assert unpack(so.finished_reqs, HANDLE).tolist() == [1]
    assert scheduler.num_preemptions == 1
    result = run_engine_loop(scheduler, runner, on_step=lambda so, out: check_block_accounting(scheduler))
    assert scheduler.num_free_blocks == 4
    assert len(result.tokens[1]) == 7                  # 1 token before the preemption, 7 after it


def test_blocks_of_a_finished_request_are_freed_tail_first():
    scheduler, runner = make_scheduler(num_blocks=8, block_size=4, enable_prefix_caching=False)
    add_request(scheduler, 0, 9, max_tokens=1)          # blocks 1, 2, 3
    step(scheduler, runner)
    free = [b.block_id for b in scheduler.kv_cache_manager.block_pool.free_block_queue]
    assert free == [4, 5, 6, 7, 3, 2, 1]


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], {}, "prompt is empty"),
        (list(range(1, 33)), {}, "exceeds max_model_len"),
        (list(range(1, 10)), {"max_tokens": 20}, "needs 7 KV blocks"),
        ([1, 2], {"n": 2}, "n == 1"),
    ],
)
def test_requests_that_can_never_run_are_refused(prompt, params, message):
    scheduler = Scheduler(EngineConfig(block_size=4, max_model_len=32, max_num_batched_tokens=64), 7)
    msg = AddRequest(req=1, prompt_token_ids=pack(prompt, TOKEN), params=SamplingParams(**params).resolved(),
                     eos_token_ids=[0], arrival_time=0.0)
    with pytest.raises(ValueError, match=message):
        scheduler.add_request(msg)
    assert not scheduler.has_unfinished_requests()


def test_a_handle_in_use_is_refused():
    scheduler, _ = make_scheduler()
    add_request(scheduler, 3, 4)
    with pytest.raises(ValueError, match="already in use"):
        add_request(scheduler, 3, 4)


def test_config_without_lengths_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(EngineConfig(max_num_batched_tokens=64), 8)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(EngineConfig(max_model_len=64), 8)


def test_stats_follow_the_queues_and_the_pool():
    scheduler, runner = make_scheduler(num_blocks=9, max_num_seqs=1)
    add_request(scheduler, 0, 6)
    add_request(scheduler, 1, 6)
    step(scheduler, runner)
    stats = scheduler.make_stats()
    assert (stats.num_running, stats.num_waiting, stats.step) == (1, 1, 1)
    assert stats.num_free_blocks == 6 and stats.kv_cache_usage == pytest.approx(2 / 8)


def test_reset_prefix_cache_waits_for_idle_blocks():
    scheduler, runner = make_scheduler(block_size=4)
    add_request(scheduler, 0, 9, max_tokens=2)
    step(scheduler, runner)
    assert scheduler.reset_prefix_cache() is False
    step(scheduler, runner)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.reset_prefix_cache() is True
    add_request(scheduler, 1, list(range(1, 10)))
    so, _ = step(scheduler, runner)
    assert so.new_reqs[0].num_computed_tokens == 0


def test_cache_salt_keeps_tenants_apart_in_the_scheduler():
    scheduler, runner = make_scheduler(block_size=4)
    prompt = list(range(1, 14))
    add_request(scheduler, 0, prompt, cache_salt="a")
    step(scheduler, runner)
    add_request(scheduler, 1, prompt, cache_salt="b")
    add_request(scheduler, 2, prompt, cache_salt="a")
    so, _ = step(scheduler, runner)
    news = {new.req: new for new in so.new_reqs}
    assert news[1].num_computed_tokens == 0
    assert news[2].num_computed_tokens == 12
    tables = {req: set(r.block_id for r in scheduler.requests[req].blocks) for req in (0, 1, 2)}
    assert not tables[1] & (tables[0] | tables[2])
    assert len(tables[0] & tables[2]) == 3


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_aborted_waiting_requests_leave_the_queue(policy):
    scheduler, runner = make_scheduler(max_num_seqs=1, scheduling_policy=policy)
    for req in range(4):
        add_request(scheduler, req, 3, max_tokens=1)
    scheduler.abort_requests([0, 2])
    assert scheduler.make_stats().num_waiting == 2
    order = []
    while scheduler.has_unfinished_requests():
        so, _ = step(scheduler, runner)
        order += [new.req for new in so.new_reqs]
    assert order == [1, 3]
    assert scheduler.make_stats().num_waiting == 0


def test_a_step_admits_new_requests_only_as_far_as_the_broadcast_ring_takes_them():
    """Prefix-cache hits let many long prompts start in one step (each needs only a few new tokens), and a
    new request carries its whole prompt: the scheduler spreads them over steps so that no encoded step
    outgrows the broadcast ring, instead of killing the engine with a message that can never fit."""
    ring_bytes = 64 << 10
    scheduler, runner = make_scheduler(num_blocks=1024, block_size=16, max_model_len=2048, max_num_seqs=64,
                                       max_num_batched_tokens=2048, ring_bytes=ring_bytes)
    codec = Codec(ExecutorIn)
    prefix = [1 + i % 300 for i in range(1000)]
    add_request(scheduler, 0, prefix + [7], max_tokens=2)
    run_engine_loop(scheduler, runner)
    sizes, admitted = [], []

    def on_step(so, out):
        sizes.append(len(codec.encode(so)))
        admitted.append(len(so.new_reqs))

    for req in range(1, 41):
        add_request(scheduler, req, prefix + [req] * 8, max_tokens=2)
    result = run_engine_loop(scheduler, runner, on_step=on_step)
    assert sorted(result.finish_reasons) == list(range(1, 41))
    assert max(sizes) <= ring_bytes // 2 + 4096        # the columns ride beside the capped new requests
    assert max(sizes) > ring_bytes // 4 and sum(admitted) == 40 and max(admitted) < 40
    check_block_accounting(scheduler)
