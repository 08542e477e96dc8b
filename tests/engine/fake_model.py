"""A deterministic fake executor for scheduler tests: it keeps the state a real executor keeps, from the
SchedulerOutput diffs alone, and checks the KV cache it would attend over.

Each token position p of a request has a fingerprint: a hash of the request's tokens 0..p. Computing a
position writes its fingerprint into the KV slot the block table names; attending reads back the slots of
every earlier position and demands the fingerprints of this request's own tokens. So a wrong prefix-cache
hit, a block handed to two requests, a block reused before its owner finished, or a stale block table all
fail loudly. The sampled token is a function of the last fingerprint, i.e. of all the request's tokens so
far, so a request resumed with the wrong tokens generates a different continuation.

Speculative decoding: a step's draft tokens are computed like known tokens (their fingerprints written,
everything before them checked), the runner samples at each draft position and keeps the accepted run, as
the real executor does; the rejected positions' slots keep stale fingerprints, which a later step must
overwrite before anything attends over them. `next_token="last"` makes the sampled token a function of the
last token alone, so that sequences cycle and prompt lookup's drafts get accepted.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.config import EngineConfig, parse_speculative_config
from engine.core.scheduler import Scheduler
from engine.messages import (
    HANDLE,
    TOKEN,
    AddRequest,
    Codec,
    EngineOutputs,
    ExecutorIn,
    ModelRunnerOutput,
    SchedulerOutput,
    pack,
    unpack,
)
from engine.sampling_params import SamplingParams

_MASK63 = (1 << 63) - 1


def fingerprint(parent: int, token: int) -> int:
    """splitmix64 of (parent, token), kept to 63 bits so it fits an int64 KV slot."""
    z = (parent * 0x9E3779B97F4A7C15 + token + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & _MASK63


class _ExecutorRequest:
    __slots__ = ("tokens", "fingerprints", "block_ids", "num_computed_tokens")

    def __init__(self, tokens: list[int], block_ids: list[int], num_computed_tokens: int) -> None:
        self.tokens = tokens
        self.fingerprints: list[int] = []
        self.block_ids = block_ids
        self.num_computed_tokens = num_computed_tokens

    def fingerprint_upto(self, end: int) -> np.ndarray:
        prints = self.fingerprints
        for p in range(len(prints), end):
            prints.append(fingerprint(prints[-1] if prints else 0, self.tokens[p]))
        return np.asarray(prints[:end], dtype=np.int64)


class FakeModelRunner:
    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 64, roundtrip: bool = True,
                 script: dict[int, list[int]] | None = None, next_token: str = "hash") -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.next_token = next_token
        # Tokens to sample, in order, for some requests (stop-check tests); others follow the hash.
        self.script = {req: list(tokens) for req, tokens in (script or {}).items()}
        self.kv = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.requests: dict[int, _ExecutorRequest] = {}
        # Encode and decode every step as the broadcast ring would, to catch what msgpack cannot carry.
        self._codec = Codec(ExecutorIn) if roundtrip else None

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        so = scheduler_output
        if self._codec is not None:
            so = self._codec.decode(self._codec.encode(so))
        for handle, num_kept in so.truncated_block_tables:
            assert num_kept < len(self.requests[handle].block_ids), f"step {so.step}: {handle} cut to {num_kept}"
            del self.requests[handle].block_ids[num_kept:]
        for handle in unpack(so.finished_reqs, HANDLE).tolist():
            assert handle in self.requests, f"step {so.step}: dropping unknown request {handle}"
            del self.requests[handle]
        for new in so.new_reqs:
            assert new.req not in self.requests, f"step {so.step}: request {new.req} sent twice"
            tokens = unpack(new.prompt_token_ids, TOKEN).tolist()
            tokens += unpack(new.output_token_ids, TOKEN).tolist()
            self.requests[new.req] = _ExecutorRequest(
                tokens, unpack(new.block_ids, TOKEN).tolist(), new.num_computed_tokens)
        for handle, block_ids in so.new_block_ids:
            self.requests[handle].block_ids.extend(unpack(block_ids, TOKEN).tolist())

        sampled_reqs, sampled_tokens, num_sampled = [], [], []
        handles = unpack(so.reqs, HANDLE).tolist()
        counts = unpack(so.num_scheduled_tokens, TOKEN).tolist()
        computed = unpack(so.num_computed_tokens, TOKEN).tolist()
        drafts = {}
        if so.drafts is not None:
            draft_tokens = unpack(so.drafts.token_ids, TOKEN).tolist()
            at = 0
            for position, count in zip(unpack(so.drafts.positions, TOKEN).tolist(),
                                       unpack(so.drafts.counts, TOKEN).tolist(), strict=True):
                drafts[handles[position]] = draft_tokens[at:at + count]
                at += count
        assert sum(counts) == so.total_num_scheduled_tokens
        for handle, n, start in zip(handles, counts, computed, strict=True):
            state = self.requests[handle]
            assert state.num_computed_tokens == start, (
                f"step {so.step}: request {handle} computed {state.num_computed_tokens}, "
                f"the scheduler says {start}")
            end = start + n
            draft = drafts.get(handle, [])
            known = len(state.tokens)
            assert 0 < n and end <= known + len(draft), (
                f"step {so.step}: request {handle} scheduled past its tokens")
            state.tokens.extend(draft)
            state.fingerprints = state.fingerprints[:known]
            prints = state.fingerprint_upto(end)
            slots = self.slots(state.block_ids, end)
            self.kv[slots[start:end]] = prints[start:end]
            assert np.array_equal(self.kv[slots], prints), (
                f"step {so.step}: request {handle} attends over KV that is not its own tokens")
            if end < known + len(draft):
                state.num_computed_tokens = end
                continue
            run = []
            for position in range(known - 1, known + len(draft)):   # sample at the last token and each draft
                token = self._sample(handle, state.tokens[position], prints[position])
                run.append(token)
                if position - known + 1 >= len(draft) or token != draft[position - known + 1]:
                    break
            del state.tokens[known:]
            del state.fingerprints[known:]
            state.tokens.extend(run)
            state.num_computed_tokens = known - 1 + len(run)
            sampled_reqs.append(handle)
            sampled_tokens.extend(run)
            num_sampled.append(len(run))
        return ModelRunnerOutput(
            step=so.step,
            reqs=pack(sampled_reqs, HANDLE),
            sampled_token_ids=pack(sampled_tokens, TOKEN),
            logprobs=[],
            prompt_logprobs=[],
            num_sampled=pack(num_sampled, TOKEN) if so.drafts is not None else b"",
        )

    def _sample(self, handle: int, last_token: int, last_print: int) -> int:
        scripted = self.script.get(handle)
        if scripted:
            return scripted.pop(0)
        if self.next_token == "last":
            return (last_token * 7 + 13) % self.vocab_size
        return int(last_print >> 7) % self.vocab_size

    def slots(self, block_ids: list[int], num_tokens: int) -> np.ndarray:
        """KV slot of positions 0..num_tokens-1: block_id * block_size + offset."""
        positions = np.arange(num_tokens)
        table = np.asarray(block_ids, dtype=np.int64)
        assert (num_tokens - 1) // self.block_size < len(table), "block table too short for the tokens"
        return table[positions // self.block_size] * self.block_size + positions % self.block_size


def check_block_accounting(scheduler: Scheduler) -> None:
    """Every block's ref count equals the number of live requests holding it; the free list holds exactly
    the unreferenced blocks, once each; the null block is never handed out."""
    pool = scheduler.kv_cache_manager.block_pool
    holders = np.zeros(pool.num_blocks, dtype=np.int64)
    for request in scheduler.requests.values():
        ids = [b.block_id for b in request.blocks]
        assert len(set(ids)) == len(ids), f"{request} holds a block twice"
        holders[ids] += 1
    assert holders[0] == 0, "the null block was handed out"
    refs = np.array([b.ref_cnt for b in pool.blocks])
    assert np.array_equal(refs[1:], holders[1:]), "ref counts disagree with the block tables"
    free = [b.block_id for b in pool.free_block_queue]
    assert len(free) == len(set(free)) == pool.num_free_blocks
    assert sorted(free) == [i for i in range(1, pool.num_blocks) if refs[i] == 0]
    for block_hash, block in pool.cached_block_hash_to_block.items():
        assert block.block_hash == block_hash


# ----------------------------------------------------------------------------- builders for the tests
EOS = 0
_clock = itertools.count(1)


def make_scheduler(num_blocks: int = 64, **config) -> tuple[Scheduler, FakeModelRunner]:
    settings = dict(block_size=4, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64)
    settings.update(config)
    script = settings.pop("script", None)
    next_token = settings.pop("next_token", "hash")
    cfg = EngineConfig(**settings)
    if cfg.speculative_config is not None:
        cfg.speculative_config = parse_speculative_config(cfg.speculative_config)
    return Scheduler(cfg, num_blocks), FakeModelRunner(num_blocks, cfg.block_size, script=script,
                                                       next_token=next_token)


def add_request(scheduler: Scheduler, req: int, prompt: list[int] | int, *, priority: int = 0,
                cache_salt: str | None = None, arrival_time: float | None = None, **params) -> AddRequest:
    """Queue a request; `prompt` is a token list or a length (tokens 1..n offset by the handle)."""
    if isinstance(prompt, int):
        prompt = [100 * req + i + 1 for i in range(prompt)]
    params.setdefault("max_tokens", 8)
    msg = AddRequest(
        req=req,
        prompt_token_ids=pack(prompt, TOKEN),
        params=SamplingParams(**params).resolved(),
        eos_token_ids=[EOS],
        arrival_time=next(_clock) if arrival_time is None else arrival_time,
        priority=priority,
        cache_salt=cache_salt,
    )
    scheduler.add_request(msg)
    return msg


def step(scheduler: Scheduler, runner: FakeModelRunner) -> tuple[SchedulerOutput, EngineOutputs]:
    so = scheduler.schedule()
    ro = runner.execute_model(so) if so.total_num_scheduled_tokens else None
    return so, scheduler.update_from_output(so, ro)


def scheduled(so: SchedulerOutput) -> dict[int, int]:
    """handle -> tokens scheduled this step, in batch order."""
    counts = unpack(so.num_scheduled_tokens, TOKEN).tolist()
    return dict(zip(unpack(so.reqs, HANDLE).tolist(), counts, strict=True))


def new_tokens(out: EngineOutputs) -> dict[int, int]:
    tokens = unpack(out.new_token_ids, TOKEN).tolist()
    return dict(zip(unpack(out.reqs, HANDLE).tolist(), tokens, strict=True))


def new_token_runs(out: EngineOutputs) -> dict[int, list[int]]:
    """handle -> the tokens it produced this step, in order (several under speculative decoding)."""
    runs: dict[int, list[int]] = {}
    for handle, token in zip(unpack(out.reqs, HANDLE).tolist(), unpack(out.new_token_ids, TOKEN).tolist()):
        runs.setdefault(handle, []).append(token)
    return runs


def finished(out: EngineOutputs) -> dict[int, tuple[int, int | None]]:
    """handle -> (FINISH_* code, stop reason)."""
    handles = unpack(out.finished_reqs, HANDLE).tolist()
    reasons = zip(handles, out.finish_reasons, out.stop_reasons, strict=True)
    return {h: (code, stop) for h, code, stop in reasons}


class RunResult:
    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.finish_reasons: dict[int, int] = {}
        self.stop_reasons: dict[int, int | None] = {}
        self.steps = 0


class _Pipeline:
    """EngineCore._step_async over the fake runner: at most one step in flight beyond the one applied."""

    def __init__(self, scheduler: Scheduler, runner: FakeModelRunner) -> None:
        self.scheduler, self.runner = scheduler, runner
        self.in_flight: list[tuple[SchedulerOutput, ModelRunnerOutput | None]] = []

    @property
    def busy(self) -> bool:
        return bool(self.in_flight)

    def step(self) -> tuple[SchedulerOutput | None, EngineOutputs | None]:
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens:
            self.in_flight.append((so, self.runner.execute_model(so)))
            if len(self.in_flight) < 2:
                return None, None
        elif not self.in_flight:
            return so, self.scheduler.update_from_output(so, None)
        older, result = self.in_flight.pop(0)
        return older, self.scheduler.update_from_output(older, result)


def run_engine_loop(scheduler: Scheduler, runner: FakeModelRunner, max_steps: int = 10_000,
                    arrivals: dict[int, list] | None = None, aborts: dict[int, list[int]] | None = None,
                    on_step=None, pipelined: bool = False) -> RunResult:
    """Drive the scheduler as the engine loop does: add/abort, schedule, execute, update; collect the
    tokens each request streamed. `arrivals` / `aborts` map a step number to AddRequests / handles.

    pipelined: as EngineCore does under async scheduling, each step is scheduled before the previous
    step's result is applied (the executor runs steps in order, so executing at submit time is exact)."""
    pipeline = _Pipeline(scheduler, runner) if pipelined else None
    arrivals = arrivals or {}
    aborts = aborts or {}
    last_event = max([*arrivals, *aborts], default=0)
    result = RunResult()
    for step_index in range(max_steps):
        for msg in arrivals.get(step_index, ()):
            scheduler.add_request(msg)
            result.tokens[msg.req] = []
        if step_index in aborts:
            scheduler.abort_requests(aborts[step_index])
        busy = scheduler.has_unfinished_requests() or scheduler.has_pending_outputs() \
            or (pipeline is not None and pipeline.busy)
        if step_index > last_event and not busy:
            result.steps = step_index
            return result
        so, out = step(scheduler, runner) if pipeline is None else pipeline.step()
        if out is None:
            continue
        for handle, tokens in new_token_runs(out).items():
            result.tokens.setdefault(handle, []).extend(tokens)
        for handle, (reason, stop) in finished(out).items():
            assert handle not in result.finish_reasons, f"request {handle} finished twice"
            result.finish_reasons[handle] = reason
            result.stop_reasons[handle] = stop
        if on_step is not None:
            on_step(so, out)
    raise AssertionError(f"the engine loop did not finish within {max_steps} steps")

