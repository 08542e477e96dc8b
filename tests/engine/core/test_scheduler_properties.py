"""Property tests: random workloads (arrivals, lengths, shared prefixes, salts, aborts, tiny block pools)
against the invariants the engine relies on.

Each step: the token budget and max_num_seqs hold, every block's ref count matches the tables that hold it,
and the fake executor finds its own tokens in every KV slot it attends over. At the end: every request
finished, every block is free, and every request that was not aborted produced exactly the tokens (and
finish reason) it produces in a pool so large that nothing is ever preempted.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.messages import FINISH_ABORT, HANDLE, TOKEN, AddRequest, pack, unpack
from engine.sampling_params import SamplingParams
from tests.engine.fake_model import EOS, FakeModelRunner, check_block_accounting, run_engine_loop


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(8, 48))
    max_num_seqs = draw(st.integers(1, 6))
    config = EngineConfig(
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(1, 40)),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_prefix_caching=draw(st.sampled_from([True, True, False])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3])),
    )
    bases = draw(st.lists(st.lists(st.integers(1, 30), min_size=max_model_len, max_size=max_model_len),
                          min_size=1, max_size=3))
    requests, aborts, largest = [], {}, 1
    for req in range(draw(st.integers(1, 10))):
        base = draw(st.sampled_from(bases))
        shared = draw(st.integers(0, max_model_len - 1))
        tail = draw(st.lists(st.integers(1, 30), max_size=max_model_len - 1 - shared))
        prompt = (base[:shared] + tail) or [base[0]]
        room = max_model_len - len(prompt)
        max_tokens = draw(st.one_of(st.none(), st.integers(1, room)))
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=draw(st.integers(0, min(3, max_tokens or room))),
            ignore_eos=draw(st.booleans()),
            stop_token_ids=draw(st.lists(st.integers(1, 30), max_size=2)),
            prompt_logprobs=draw(st.sampled_from([None, None, None, 1])),
        ).resolved()
        arrival = draw(st.integers(0, 30))
        requests.append((arrival, AddRequest(
            req=req, prompt_token_ids=pack(prompt, TOKEN), params=params, eos_token_ids=[EOS],
            arrival_time=float(arrival), priority=draw(st.integers(0, 2)),
            cache_salt=draw(st.sampled_from([None, None, None, "a", "b"])))))
        if draw(st.integers(0, 4)) == 0:
            aborts.setdefault(arrival + draw(st.integers(0, 15)), []).append(req)
        total = min(len(prompt) + (max_tokens or room), max_model_len)
        largest = max(largest, -(-(total - 1) // block_size))
    # The smallest pool that can still run the largest request alone, plus a few blocks.
    num_blocks = largest + 1 + draw(st.integers(0, 6))
    return config, num_blocks, requests, aborts


def run(config: EngineConfig, num_blocks: int, requests, aborts, check: bool, pipelined: bool = False):
    if pipelined:
        config = msgspec.structs.replace(config, async_scheduling=True)
    scheduler = Scheduler(config, num_blocks)
    runner = FakeModelRunner(num_blocks, config.block_size, vocab_size=32)
    arrivals: dict[int, list[AddRequest]] = {}
    for arrival, msg in requests:
        arrivals.setdefault(arrival, []).append(msg)

    def check_step(so, out):
        assert so.total_num_scheduled_tokens <= config.max_num_batched_tokens
        if config.long_prefill_token_threshold:
            assert max(unpack(so.num_scheduled_tokens, TOKEN), default=0) <= config.long_prefill_token_threshold
        assert len(unpack(so.reqs, HANDLE)) <= config.max_num_seqs
        assert len(scheduler.running) <= config.max_num_seqs
        check_block_accounting(scheduler)

    result = run_engine_loop(scheduler, runner, max_steps=5000, arrivals=arrivals, aborts=aborts,
                             on_step=check_step if check else None, pipelined=pipelined)
    return scheduler, result


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_keep_the_invariants_and_the_tokens(workload):
    _check_workload(workload, pipelined=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_async_scheduling_keeps_the_invariants_and_the_tokens(workload):
    """Each step scheduled while the previous one runs (its samples unknown): same invariants, and every
    request that was not aborted produces the tokens of the serial, never-preempted reference."""
    _check_workload(workload, pipelined=True)


def _check_workload(workload, pipelined: bool) -> None:
    config, num_blocks, requests, aborts = workload
    scheduler, result = run(config, num_blocks, requests, aborts, check=True, pipelined=pipelined)

    handles = {msg.req for _, msg in requests}
    event("preempted" if scheduler.num_preemptions else "no preemption")
    event("prefix hits" if scheduler.kv_cache_manager.prefix_cache_hits else "no prefix hits")
    assert set(result.finish_reasons) == handles, "a request never finished"
    assert not scheduler.has_unfinished_requests()
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.num_free_blocks == num_blocks - 1
    assert all(block.ref_cnt == 0 for block in pool.blocks)

    _, reference = run(config, 4096, requests, {}, check=False)
    for req in handles:
        if result.finish_reasons[req] == FINISH_ABORT:
            continue
        assert result.tokens[req] == reference.tokens[req], f"request {req} generated other tokens"
        assert result.finish_reasons[req] == reference.finish_reasons[req]
        assert result.stop_reasons[req] == reference.stop_reasons[req]
