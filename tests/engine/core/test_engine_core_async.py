"""EngineCore under async scheduling (the in-process executor and the zero-cost fake model): the same tokens
and finish reasons as the serial loop, outputs lagging one step, and no output lost when a control call
drains the steps in flight."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.executor.group import LocalExecutor
from engine.messages import HANDLE, TOKEN, AddRequest, ControlCall, pack, unpack
from engine.sampling_params import SamplingParams


def _core(async_scheduling: bool) -> EngineCore:
    config = EngineConfig(load_format="fake", in_process=True, max_model_len=256, max_num_seqs=4,
                          max_num_batched_tokens=64, block_size=4, async_scheduling=async_scheduling).finalize()
    core = EngineCore(config, LocalExecutor(config))
    for req in range(6):
        params = SamplingParams(max_tokens=3 + 5 * req, stop_token_ids=[13], ignore_eos=True).resolved()
        core.handle(AddRequest(req=req, prompt_token_ids=pack([req + 1] * (5 + 9 * req), TOKEN), params=params,
                               eos_token_ids=[0], arrival_time=float(req)))
    return core


def _run(core: EngineCore, control_at: int | None = None) -> tuple[dict, dict, int]:
    tokens: dict[int, list[int]] = {}
    finished: dict[int, int] = {}
    steps = 0
    while core.has_work:
        steps += 1
        if steps == control_at:
            reply = core.handle(ControlCall(call_id=1, method="stop_profile"))
            assert reply.ok and reply.result == "not profiling"
        out = core.step()
        if out is None:
            continue
        for req, token in zip(unpack(out.reqs, HANDLE).tolist(), unpack(out.new_token_ids, TOKEN).tolist(),
                              strict=True):
            tokens.setdefault(req, []).append(token)
        finished.update(zip(unpack(out.finished_reqs, HANDLE).tolist(), out.finish_reasons, strict=True))
        assert steps < 1000
    return tokens, finished, steps


def test_async_steps_give_the_serial_tokens():
    serial = _run(_core(async_scheduling=False))
    pipelined = _run(_core(async_scheduling=True))
    assert pipelined[:2] == serial[:2]
    assert sorted(serial[1]) == list(range(6))
    assert pipelined[2] <= serial[2] + 2          # one step of lag, plus one that finds only finished work


def test_a_control_call_drains_the_steps_in_flight_without_losing_outputs():
    serial = _run(_core(async_scheduling=False))
    assert _run(_core(async_scheduling=True), control_at=7)[:2] == serial[:2]
