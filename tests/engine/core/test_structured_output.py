"""Structured outputs in the scheduler: compiles off the loop, the bitmask it fills, errors that end one
request, and the interactions (chunked prefill, preemption, prefix caching, mixed batches).

The engine here is the real Scheduler driving the torch-free fake executor (engine/executor/fake_runner.py)
over the real wire codec; the fake samples adversarially (its preferred token is one the grammar forbids,
and only the mask moves it), so every valid output below is the mask's doing.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.executor.fake_runner import FakeModelRunner
from engine.messages import (
    FINISH_REASONS,
    HANDLE,
    TOKEN,
    AddRequest,
    Codec,
    ExecutorIn,
    pack,
    unpack,
)
from engine.models.demo import ensure_demo_model
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from tests.engine.structured_checks import check_output, constraints, tokenizer_info

EOS = [258]


def make_engine(**overrides):
    options = dict(model=ensure_demo_model(), load_format="fake", max_model_len=256, max_num_seqs=8,
                   max_num_batched_tokens=256, num_gpu_blocks_override=200, block_size=4)
    options.update(overrides)
    config = EngineConfig(**options).finalize()
    runner = FakeModelRunner(config)
    runner.initialize_kv_cache(config.num_gpu_blocks_override)
    return Scheduler(config, config.num_gpu_blocks_override), runner


class Driver:
    """The engine loop of EngineCore.step, with every SchedulerOutput through the broadcast codec."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner) -> None:
        self.scheduler, self.runner = scheduler, runner
        self.codec = Codec(ExecutorIn)
        self.tokens: dict[int, list[int]] = {}
        self.finish: dict[int, str] = {}
        self.errors: dict[int, str] = {}
        self.masked_steps = 0

    def add(self, req: int, prompt: list[int], params: SamplingParams) -> None:
        self.scheduler.add_request(AddRequest(req=req, prompt_token_ids=pack(prompt, TOKEN),
                                              params=params.resolved(), eos_token_ids=EOS,
                                              arrival_time=time.monotonic()))
        self.tokens[req] = []

    def step(self) -> None:
        so = self.scheduler.schedule()
        so.grammar = self.scheduler.grammar_rows()
        so = self.codec.decode(self.codec.encode(so))
        if so.grammar is not None:
            self.masked_steps += 1
        result = self.runner.execute(so) if (so.total_num_scheduled_tokens or so.new_reqs
                                             or len(so.finished_reqs)) else None
        out = self.scheduler.update_from_output(so, result)
        for handle, token in zip(unpack(out.reqs, HANDLE).tolist(), unpack(out.new_token_ids, TOKEN).tolist()):
            self.tokens[handle].append(token)
        for handle, reason in zip(unpack(out.finished_reqs, HANDLE).tolist(), out.finish_reasons):
            self.finish[handle] = FINISH_REASONS[reason]
        self.errors.update(dict(out.errors))

    def run(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.scheduler.has_unfinished_requests():
            assert time.monotonic() < deadline, "the engine did not finish"
            if self.scheduler.only_compiling:
                time.sleep(0.001)
            self.step()


def text_of(tokens: list[int]) -> str:
    tokenizer, _ = tokenizer_info()
    return tokenizer.decode([t for t in tokens if t not in EOS])


def params(so: StructuredOutputsParams | None, max_tokens: int = 40, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=so, **extra)


def test_every_kind_is_forced_by_the_mask():
    driver = Driver(*make_engine())
    kinds = constraints()
    for req, so in enumerate(kinds.values()):
        driver.add(req, [1, 2, 3 + req], params(so, max_tokens=80))
    driver.run()
    for req, so in enumerate(kinds.values()):
        check_output(so, driver.tokens[req], text_of(driver.tokens[req]), driver.finish[req], EOS)
    # Random or not, these grammars end: every one must have reached its end within 80 tokens.
    assert all(driver.finish[req] == "stop" for req in range(len(kinds))), driver.finish
    assert driver.masked_steps > 0


def test_the_mask_overrules_the_fake_models_preference():
    """Without the mask the fake's next token is (last * 7 + 13) % V; the output must differ from that."""
    scheduler, runner = make_engine()
    driver = Driver(scheduler, runner)
    so = StructuredOutputsParams(regex="[0-9]{6}")
    driver.add(0, [5], params(so))
    driver.run()
    tokens = driver.tokens[0]
    vocab = scheduler.grammars.vocab_size
    unconstrained = [(t * 7 + 13) % vocab for t in [5, *tokens[:-1]]]
    assert tokens != unconstrained
    assert text_of(tokens).isdigit() and len(text_of(tokens)) == 6


def test_a_request_waiting_for_its_grammar_blocks_nobody(monkeypatch):
    scheduler, runner = make_engine()
    release = threading.Event()
    original = scheduler.grammars._compile

    def slow_compile(so, job):
        release.wait(30)
        return original(so, job)

    monkeypatch.setattr(scheduler.grammars, "_compile", slow_compile)
    driver = Driver(scheduler, runner)
    driver.add(0, [1, 2], params(constraints()["choice"]))
    driver.add(1, [3, 4], params(None, max_tokens=5))
    for _ in range(20):
        driver.step()
    assert driver.finish.get(1) == "length" and 0 not in driver.finish
    assert scheduler.only_compiling
    release.set()
    driver.run()
    assert driver.finish[0] == "stop" and text_of(driver.tokens[0]) in constraints()["choice"].choice


def test_children_and_repeats_share_one_compile():
    scheduler, _ = make_engine()
    manager = scheduler.grammars
    a = manager.submit(StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}}), EOS)
    b = manager.submit(StructuredOutputsParams(json='{"properties": {"a": {"type": "integer"}}, "type": "object"}'),
                       EOS)
    c = manager.submit(StructuredOutputsParams(json={"type": "object"}), EOS)
    d = manager.submit(StructuredOutputsParams(json={"type": "object"}, disable_any_whitespace=True), EOS)
    assert a.job is b.job                              # the same schema, as a dict and as text
    assert len({id(a.job), id(c.job), id(d.job)}) == 3  # options are part of the key
    a.job.future.result(30)


def test_a_grammar_that_fails_to_compile_ends_only_its_request():
    """The frontend refuses such grammars first; the scheduler must survive one anyway."""
    driver = Driver(*make_engine())
    driver.add(0, [1], params(StructuredOutputsParams(grammar='root ::= undefined_rule')))
    driver.add(1, [2], params(None, max_tokens=4))
    driver.run()
    assert driver.finish == {0: "error", 1: "length"}
    assert "undefined_rule" in driver.errors[0] and "/project/" not in driver.errors[0]
    # and the next request with a good grammar still works
    driver.add(2, [3], params(constraints()["regex"]))
    driver.run()
    assert driver.finish[2] == "stop"


def test_a_compile_past_its_deadline_ends_its_request_and_a_repeat_tries_again(monkeypatch):
    scheduler, runner = make_engine(grammar_compile_timeout_s=0.2)
    original = scheduler.grammars._compile
    slow = {"on": True}

    def compile_(so, job):
        result = original(so, job)
        if slow["on"]:
            time.sleep(1.0)
        return result

    monkeypatch.setattr(scheduler.grammars, "_compile", compile_)
    driver = Driver(scheduler, runner)
    so = constraints()["regex"]
    driver.add(0, [1], params(so))
    driver.add(1, [2], params(None, max_tokens=30))
    start = time.monotonic()
    driver.run()
    assert driver.finish == {0: "error", 1: "length"}
    assert "longer than 0.2 s" in driver.errors[0]
    assert time.monotonic() - start < 5
    slow["on"] = False
    driver.add(2, [1], params(so))
    driver.run()
    assert driver.finish[2] == "stop"


def test_abort_while_compiling(monkeypatch):
    scheduler, runner = make_engine()
    release = threading.Event()
    original = scheduler.grammars._compile
    monkeypatch.setattr(scheduler.grammars, "_compile", lambda so, job: (release.wait(30), original(so, job))[1])
    driver = Driver(scheduler, runner)
    driver.add(0, [1], params(constraints()["regex"]))
    scheduler.abort_requests([0])
    driver.step()
    assert driver.finish == {0: "abort"} and not scheduler.compiling and not scheduler.has_unfinished_requests()
    release.set()


def run_batch(structured: bool, **engine) -> tuple[Driver, dict[int, list[int]]]:
    driver = Driver(*make_engine(**engine))
    prompts = [[i + 1] * (3 + 5 * i) for i in range(6)]
    kinds = list(constraints().values())
    for req, prompt in enumerate(prompts):
        so = kinds[req % len(kinds)] if structured and req % 2 == 0 else None
        driver.add(req, prompt, params(so, max_tokens=30))
    driver.run()
    return driver, driver.tokens


def test_free_requests_are_unchanged_by_constrained_neighbours():
    _, alone = run_batch(structured=False)
    driver, mixed = run_batch(structured=True)
    for req in (1, 3, 5):
        assert mixed[req] == alone[req]
    for req in (0, 2, 4):
        assert mixed[req] != alone[req]


@pytest.mark.parametrize("engine", [
    dict(max_num_batched_tokens=8, max_num_seqs=8),               # chunked prefill: several chunks a prompt
    dict(num_gpu_blocks_override=17, block_size=4),              # preemption: too few blocks for the batch
    dict(enable_prefix_caching=False),
])
def test_constrained_outputs_survive_chunking_preemption_and_caching(engine):
    reference, expected = run_batch(structured=True)
    driver, got = run_batch(structured=True, **engine)
    assert got == expected
    if "num_gpu_blocks_override" in engine:
        assert driver.scheduler.num_preemptions > 0
    kinds = list(constraints().values())
    for req in (0, 2, 4):
        check_output(kinds[req % len(kinds)], got[req], text_of(got[req]), driver.finish[req], EOS)


def test_rows_are_sent_only_for_steps_that_sample():
    scheduler, runner = make_engine(max_num_batched_tokens=8, max_num_seqs=8)
    driver = Driver(scheduler, runner)
    driver.add(0, list(range(1, 30)), params(constraints()["choice"]))
    scheduler.compiling[0].grammar.job.future.result(30)
    rows = []
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        rows.append(scheduler.grammar_rows())
        result = runner.execute(so if rows[-1] is None else _with(so, rows[-1]))
        scheduler.update_from_output(so, result)
    # 29 prompt tokens in chunks of 8: three chunks sample nothing, the fourth samples the first token.
    assert [r is None for r in rows[:3]] == [True, True, True]
    assert all(r is not None for r in rows[3:])
    first = rows[3]
    assert np.frombuffer(first.positions, "<i4").tolist() == [0]


def _with(so, grammar):
    so.grammar = grammar
    return so


def test_min_tokens_cannot_keep_a_finished_grammar_going():
    """The grammar wins: once it has taken its EOS the request ends, even under min_tokens."""
    driver = Driver(*make_engine())
    driver.add(0, [1], params(constraints()["choice"], max_tokens=40, min_tokens=30))
    driver.run()
    assert driver.finish[0] == "stop"
    assert text_of(driver.tokens[0]) in constraints()["choice"].choice


def test_ignore_eos_continues_unconstrained_after_the_grammar_ends():
    driver = Driver(*make_engine())
    driver.add(0, [1], params(constraints()["choice"], max_tokens=20, ignore_eos=True))
    driver.run()
    assert driver.finish[0] == "length" and len(driver.tokens[0]) == 20
    choices = constraints()["choice"].choice
    assert any(text_of(driver.tokens[0]).startswith(c) for c in choices)


def test_ring_is_sized_for_full_batch_masks():
    config = EngineConfig(model=ensure_demo_model(), load_format="fake", max_num_seqs=4096).finalize()
    assert config.ring_bytes >= 2 * config.grammar_mask_bytes
    small = EngineConfig(model=ensure_demo_model(), load_format="fake").finalize()
    assert small.ring_bytes == 16 << 20
