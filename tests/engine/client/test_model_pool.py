"""ModelPool on its own, over stand-in engine clients (no processes): loads on demand, least recently used
first out, never a model with requests in flight, waiters served in order and bounded, idle unload and
keep_alive, sleep and wake, a failed load, an unknown name."""

from __future__ import annotations

import asyncio

import pytest

from engine.client.model_pool import LOADED, SLEEPING, UNLOADED, ModelPool, UnknownModelError
from engine.config import EngineConfig
from engine.errors import EngineBusyError
from engine.messages import SchedulerStats
from engine.outputs import EngineDeadError


class StandIn:
    """What the pool needs of an engine client, with a log of what happened to it."""

    def __init__(self, config: EngineConfig, log: list, start_s: float = 0.01, fail: bool = False):
        self.config, self.log, self.start_s, self.fail = config, log, start_s, fail
        self.stats, self.num_unfinished, self.is_dead, self.dead_error = SchedulerStats(), 0, False, None

    def start(self):
        import time

        time.sleep(self.start_s)             # in the pool's thread, as a real start blocks
        if self.fail:
            raise RuntimeError("executor 0 failed: weights not found")
        self.log.append(("start", self.config.model_name))

    async def shutdown(self):
        self.log.append(("stop", self.config.model_name))

    async def call(self, method, **args):
        self.log.append((method, self.config.model_name))
        return method

    def fail_unfinished(self, error):
        pass


def make_pool(names=("a", "b", "c"), *, failing=(), **options):
    log: list = []
    configs = {name: EngineConfig(served_model_name=name, device="cpu", resolved_device="cpu") for name in names}
    pool = ModelPool(configs, make_client=lambda config: StandIn(config, log, fail=config.model_name in failing),
                     **options)
    return pool, log


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 20))


def test_a_request_loads_its_model_and_the_least_recently_used_idle_one_makes_room():
    async def scenario():
        pool, log = make_pool(max_loaded=2)
        for name in ("a", "b", "a", "c"):                  # b is now the least recently used
            client = await pool.acquire(name)
            assert client.config.model_name == name
            pool.release(pool.model(name))
        await asyncio.sleep(0.05)
        return pool, log

    pool, log = run(scenario())
    assert [m.state for m in pool.models.values()] == [LOADED, UNLOADED, LOADED]
    assert log == [("start", "a"), ("start", "b"), ("stop", "b"), ("start", "c")]


def test_a_model_with_requests_in_flight_is_never_unloaded_and_a_waiter_gets_a_503_in_time():
    async def scenario():
        pool, log = make_pool(max_loaded=1, wait_s=0.3)
        await pool.acquire("a")                           # held: in flight
        with pytest.raises(EngineBusyError) as refused:
            await pool.acquire("b")
        return pool, log, refused.value

    pool, log, refused = run(scenario())
    assert pool.model("a").state == LOADED and pool.model("b").state == UNLOADED
    assert ("stop", "a") not in log
    assert refused.retry_after >= 1 and "--models-max" in str(refused) and "a (1 in flight)" in str(refused)


def test_alternating_requests_two_at_a_time_all_succeed_in_order():
    """The busy model is drained: its new requests wait behind the one that asked for room, so neither side
    starves, and every request runs on its own model."""
    async def scenario():
        pool, log = make_pool(("a", "b"), max_loaded=1, wait_s=10)
        served = []

        async def request(i: int):
            name = "ab"[i % 2]
            client = await pool.acquire(name)
            assert pool.model(name).client is client and pool.model("ab"[(i + 1) % 2]).client is None
            await asyncio.sleep(0.01)
            served.append(name)
            pool.release(pool.model(name))

        for pair in range(10):
            await asyncio.gather(request(2 * pair), request(2 * pair + 1))
        return served, log

    served, log = run(scenario())
    assert sorted(served) == ["a"] * 10 + ["b"] * 10
    assert sum(1 for event in log if event[0] == "start") >= 10      # a swap per pair at least


def test_idle_models_are_unloaded_and_keep_alive_overrides_the_idle_time():
    async def scenario():
        pool, log = make_pool(("a", "b"), idle_unload_s=0.2)
        for name in ("a", "b"):
            await pool.acquire(name)
            pool.release(pool.model(name))
        pool.keep_alive("b", -1)                          # never by idleness
        await asyncio.sleep(0.6)
        states = [pool.model(n).state for n in ("a", "b")]
        pool.keep_alive("b", 0)                           # as soon as it is idle
        await asyncio.sleep(0.3)
        return states, pool.model("b").state

    states, after = run(scenario())
    assert states == [UNLOADED, LOADED] and after == UNLOADED


def test_sleep_and_wake_and_a_request_wakes_a_sleeping_model():
    async def scenario():
        pool, log = make_pool(("a",))
        await pool.load("a")
        await pool.sleep("a", 1)
        asleep = pool.model("a").state
        await pool.acquire("a")                           # wakes it
        pool.release(pool.model("a"))
        return asleep, pool.model("a").state, log

    asleep, after, log = run(scenario())
    assert asleep == SLEEPING and after == LOADED
    assert log == [("start", "a"), ("sleep", "a"), ("wake_up", "a")]


def test_a_failed_load_is_an_engine_error_and_the_next_request_tries_again():
    async def scenario():
        pool, log = make_pool(("a",), failing=("a",))
        for _ in range(2):
            with pytest.raises(EngineDeadError, match="a failed to load: executor 0 failed: weights not found"):
                await pool.acquire("a")
        return pool, log

    pool, log = run(scenario())
    assert pool.model("a").state == UNLOADED and pool.model("a").in_flight == 0
    assert log == [("stop", "a"), ("stop", "a")]          # each failed start was cleaned up


def test_a_dead_engine_is_started_again_by_the_next_request_where_the_pool_restarts_them():
    async def scenario(restart: bool):
        pool, log = make_pool(("a",), on_demand=restart)
        client = await pool.acquire("a")
        pool.release(pool.model("a"))
        client.is_dead, client.dead_error = True, "executor 0 died (killed by signal 9)"
        again = await pool.acquire("a")
        return again is client, log

    same, log = run(scenario(False))
    assert same and log == [("start", "a")]              # one model served alone: its death stays visible
    same, log = run(scenario(True))
    assert not same and log == [("start", "a"), ("stop", "a"), ("start", "a")]


def test_parked_models_make_room_by_sleeping_and_come_back_with_a_wake():
    """--models-parked 1: the model that makes room sleeps at level 2 (its slot freed, its processes kept); a
    request for it wakes it (making room in turn); a second parked model unloads the older one."""
    async def scenario():
        pool, log = make_pool(max_loaded=1, max_parked=1)
        for name in ("a", "b", "a", "c"):
            await pool.acquire(name)
            pool.release(pool.model(name))
            await asyncio.sleep(0.02)
        return pool, log

    pool, log = run(scenario())
    assert log[:6] == [("start", "a"), ("sleep", "a"), ("start", "b"), ("sleep", "b"), ("wake_up", "a"),
                       ("sleep", "a")]
    assert sorted(log[6:]) == [("start", "c"), ("stop", "b")]     # c starts while b, parked longest, goes
    assert [pool.model(n).state for n in "abc"] == [SLEEPING, UNLOADED, LOADED]


def test_an_unknown_model_is_named_with_the_ones_that_exist():
    pool, _ = make_pool(("a", "b"))
    with pytest.raises(UnknownModelError, match="`nope` does not exist; this server serves `a`, `b`"):
        pool.model("nope")
