"""Structured outputs in the scheduler: compiles off the loop, the bitmask it fills, errors that end one
request, and the interactions (chunked prefill, preemption, prefix caching, mixed batches).

The engine here is the real Scheduler driving the torch-free fake executor (engine/executor/fake_runner.py)
over the real wire codec; the fake samples adversarially (its preferred token is one the grammar forbids,
and only the mask moves it), so every valid output below is the mask's doing.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.core import structured_output
from engine.core.compile_pool import WORKER_MODULE, CompilePool
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
from tests.engine.core.held_grammar_worker import GATE_ENV
from tests.engine.structured_checks import check_output, constraints, tokenizer_info

EOS = [258]
HELD_WORKER = "tests.engine.core.held_grammar_worker"
_POOLS: dict[tuple, CompilePool] = {}


@pytest.fixture(scope="module", autouse=True)
def _compile_pools(tmp_path_factory):
    """Compile workers are processes that take seconds to start (they import xgrammar and torch), so the
    tests share them: one pool per (worker kind, size), stopped at the end of the module. The held worker
    reads its gate path from the environment it was started with."""
    gate = tmp_path_factory.mktemp("grammar") / "gate"
    saved = os.environ.get(GATE_ENV)
    os.environ[GATE_ENV] = str(gate)
    yield gate
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
    if saved is None:
        del os.environ[GATE_ENV]
    else:
        os.environ[GATE_ENV] = saved


@pytest.fixture
def gate(_compile_pools):
    """While this file exists, compiles in the held worker wait (tests/engine/core/held_grammar_worker.py)."""
    _compile_pools.touch()
    yield _compile_pools
    _compile_pools.unlink(missing_ok=True)


def make_engine(held: bool = False, **overrides):
    options = dict(model=ensure_demo_model(), load_format="fake", max_model_len=256, max_num_seqs=8,
                   max_num_batched_tokens=256, num_gpu_blocks_override=200, block_size=4)
    options.update(overrides)
    config = EngineConfig(**options).finalize()
    runner = FakeModelRunner(config)
    runner.initialize_kv_cache(config.num_gpu_blocks_override)
    scheduler = Scheduler(config, config.num_gpu_blocks_override)
    key = (held, config.grammar_compile_workers, config.skip_tokenizer_init)
    if key not in _POOLS:
        _POOLS[key] = CompilePool(config, EOS, config.grammar_compile_workers, HELD_WORKER if held else WORKER_MODULE)
    scheduler.grammars._pool = _POOLS[key]
    return scheduler, runner


def worker_pids(scheduler: Scheduler) -> list[int]:
    pool = scheduler.grammars._pool
    return [w.proc.pid for w in pool._workers if not w.gone] if pool is not None else []


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


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


def test_a_request_waiting_for_its_grammar_blocks_nobody(gate):
    scheduler, runner = make_engine(held=True)
    driver = Driver(scheduler, runner)
    driver.add(0, [1, 2], params(constraints()["choice"]))
    driver.add(1, [3, 4], params(None, max_tokens=5))
    for _ in range(20):
        driver.step()
    assert driver.finish.get(1) == "length" and 0 not in driver.finish
    assert scheduler.only_compiling
    gate.unlink()
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
    a.job.task.future.result(60)


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


def test_a_compile_past_its_deadline_is_killed_and_a_repeat_tries_again(gate):
    """The deadline ends the request and the compile: its worker process is killed (an xgrammar compile
    cannot be interrupted otherwise), and a replacement serves the next request."""
    scheduler, runner = make_engine(held=True, grammar_compile_timeout_s=0.5)
    driver = Driver(scheduler, runner)
    so = constraints()["regex"]
    driver.add(0, [1], params(so))
    driver.add(1, [2], params(None, max_tokens=30))
    pool = scheduler.grammars._pool
    wait_until(lambda: any(w.task is not None for w in pool._workers))     # the compile runs (held)
    (held_pid,) = [w.proc.pid for w in pool._workers if w.task is not None]
    driver.run()
    assert driver.finish == {0: "error", 1: "length"}
    assert "longer than 0.5 s" in driver.errors[0]
    wait_until(lambda: not os.path.exists(f"/proc/{held_pid}"))
    gate.unlink()
    driver.add(2, [1], params(so))
    driver.run()
    assert driver.finish[2] == "stop"
    assert held_pid not in worker_pids(scheduler)


def test_time_queued_behind_other_compiles_counts_against_the_deadline(gate):
    """One worker held by a slow compile: a second compile waiting in the queue reaches its deadline too
    (it never ran, so it is cancelled, not killed)."""
    scheduler, runner = make_engine(held=True, grammar_compile_timeout_s=0.5, grammar_compile_workers=1)
    driver = Driver(scheduler, runner)
    driver.add(0, [1], params(constraints()["regex"]))
    driver.add(1, [2], params(constraints()["choice"]))
    driver.run()
    assert driver.finish == {0: "error", 1: "error"}
    assert all("longer than 0.5 s" in driver.errors[req] for req in (0, 1))


def test_compiles_past_the_cap_are_refused_as_busy(gate, monkeypatch):
    monkeypatch.setattr(structured_output, "MAX_PENDING_COMPILES", 2)
    scheduler, runner = make_engine(held=True)
    driver = Driver(scheduler, runner)
    for req, regex in enumerate(["a", "b", "c"]):
        driver.add(req, [1], params(StructuredOutputsParams(regex=regex)))
    driver.add(3, [1], params(StructuredOutputsParams(regex="a")))       # joins a pending compile: accepted
    driver.step()
    assert driver.finish == {2: "error"}
    assert driver.errors[2].startswith("[busy: retry after 10 s] structured_outputs: 2 grammars")
    gate.unlink()
    driver.run()
    assert [driver.finish[req] for req in (0, 1, 3)] == ["stop", "stop", "stop"]


def test_without_a_tokenizer_every_structured_request_says_why_and_no_worker_restarts():
    scheduler, runner = make_engine(skip_tokenizer_init=True)
    driver = Driver(scheduler, runner)
    for req in range(3):
        driver.add(req, [1], params(StructuredOutputsParams(regex=f"{req}")))
        driver.run()
    assert all("skip_tokenizer_init" in driver.errors[req] for req in range(3))
    wait_until(lambda: worker_pids(scheduler) == [])
    assert scheduler.grammars._pool.pending() == 0


def test_abort_while_compiling(gate):
    scheduler, runner = make_engine(held=True)
    driver = Driver(scheduler, runner)
    driver.add(0, [1], params(constraints()["regex"]))
    scheduler.abort_requests([0])
    driver.step()
    assert driver.finish == {0: "abort"} and not scheduler.compiling and not scheduler.has_unfinished_requests()


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
    scheduler.compiling[0].grammar.job.task.future.result(60)
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
