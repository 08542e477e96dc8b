"""DPEngineClient over two real fake-model engines: the blocking face (add_request/poll) and the asyncio face
route, pin and finish requests on both ranks; control calls reach every rank; a bad pin is refused."""

from __future__ import annotations

import asyncio

import pytest

from engine.client.dp_client import DPEngineClient, device_env, make_engine_client
from engine.client.engine_client import EngineClient
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def dp():
    with DPEngineClient(EngineConfig(load_format="fake", data_parallel_size=2)) as client:
        yield client


def test_make_engine_client_picks_by_data_parallel_size():
    assert isinstance(make_engine_client(EngineConfig(load_format="fake")), EngineClient)
    assert isinstance(make_engine_client(EngineConfig(load_format="fake", data_parallel_size=3)), DPEngineClient)
    assert device_env(EngineConfig(load_format="fake", data_parallel_size=2).finalize(), 1) is None   # CPU


def test_blocking_face_routes_pins_and_finishes_every_request(dp):
    prompts = {f"r{i}": [7 + i] * 40 for i in range(6)}
    for request_id, tokens in prompts.items():
        pin = {"r0": 1, "r1": 0}.get(request_id)
        dp.add_request(request_id, tokens, PARAMS, data_parallel_rank=pin)
    assert dp._where["r0"] == 1 and dp._where["r1"] == 0
    assert {dp._where[r] for r in prompts} == {0, 1}
    tokens: dict[str, list[int]] = {r: [] for r in prompts}
    finished = set()
    for _ in range(2000):
        for delta in dp.poll(timeout=0.5):
            tokens[delta.request_id] += delta.new_token_ids
            if delta.finished:
                finished.add(delta.request_id)
        if finished == set(prompts):
            break
    assert finished == set(prompts) and all(len(t) == 5 for t in tokens.values())
    assert dp.num_unfinished == 0 and not dp._where


def test_asyncio_face_streams_from_the_pinned_rank_and_calls_reach_every_rank(dp):
    async def run() -> tuple[list[int], str]:
        out = []
        async for delta in dp.generate("a0", [3] * 20, PARAMS, data_parallel_rank=1):
            out += delta.new_token_ids
        reply = await dp.call("reset_prefix_cache")
        return out, reply

    before = [s.prefix_cache_queries for s in dp.engine_stats]
    out, reply = asyncio.run(run())
    after = [s.prefix_cache_queries for s in dp.engine_stats]
    assert len(out) == 5 and after[1] - before[1] == 20 and after[0] == before[0]
    assert reply == "dp0: True; dp1: True"


def test_a_pin_outside_the_ranks_is_refused_without_side_effects(dp):
    with pytest.raises(ValueError, match="rank 2 does not exist"):
        dp.add_request("bad", [1, 2, 3], PARAMS, data_parallel_rank=2)
    assert "bad" not in dp._where and dp.num_unfinished == 0
