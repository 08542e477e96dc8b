"""The scheduler: continuous batching over a paged KV cache, in vLLM v1's model (no prefill/decode phases).

Every request has num_computed_tokens (in the KV cache) and num_tokens (prompt plus sampled tokens); a
step closes the gap for as many requests as the token budget (max_num_batched_tokens) allows, running
requests first, in their running order, then waiting ones. A long prompt simply takes several steps
(chunked prefill). When a running request cannot get a block, the lowest-priority running request is
preempted by recompute: its blocks are freed and it waits again, keeping the tokens it has produced.

Each step's `SchedulerOutput` is a diff for the executors (a request's prompt and block table travel once;
then only appended blocks and counts); `update_from_output` takes the runner's sampled tokens, applies the
stop checks and returns the step's `EngineOutputs`. Per-step work is O(scheduled requests + changes):
no token list is re-read, re-hashed or re-encoded.

Async scheduling (config.async_scheduling): schedule() may run before the previous step's samples are
applied. A request's samples in flight (num_in_flight) count as known tokens when it is scheduled (the
executors append the tokens they sample themselves), and a request whose remaining tokens are all in flight
waits. A request that stops on a token it sampled may already be scheduled once more: that step's sample
for it is dropped like an aborted request's.

Speculative decoding (config.speculative_config; engine/core/speculator.py): a request whose known tokens
are all computed but the last may get draft tokens. It is scheduled for 1 + d tokens (the budget and the KV
slots count them), samples at each, and comes back with the accepted drafts plus one token. Its
num_computed_tokens then drops back by the rejected drafts, the stop checks run token by token (a stop
inside the accepted run drops what follows), and blocks that held only rejected drafts are freed (the
executors cut their tables with the next step). Under async scheduling a request that may draft waits for
its step in flight, as a structured one does: its drafts follow from the token still being sampled.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Iterable, Sequence

import msgspec

from engine.config import EngineConfig
from engine.core.block_pool import KVCacheBlock
from engine.core.kv_cache_manager import KVCacheManager, cdiv
from engine.core.request import FINISH_CODES, Request, RequestStatus
from engine.core.request_queue import create_request_queue, pick_preemption_victim
from engine.core.speculator import Speculator, draft_tokens, first_rows
from engine.core.structured_output import GrammarManager
from engine.messages import (
    HANDLE,
    TOKEN,
    AddRequest,
    EngineOutputs,
    GrammarRows,
    ModelRunnerOutput,
    NewRequestData,
    RequestLogprobs,
    SchedulerOutput,
    SchedulerStats,
    unpack,
)

RUNNING, PREEMPTED = RequestStatus.RUNNING, RequestStatus.PREEMPTED
FINISHED_ABORTED, FINISHED_ERROR = RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR
FINISHED_STOPPED = RequestStatus.FINISHED_STOPPED


_BIG_ENDIAN = sys.byteorder == "big"
_params_size = msgspec.msgpack.Encoder().encode


def new_request_bytes_bound(num_tokens: int, block_size: int, params_bytes: int) -> int:
    """An upper bound of an encoded NewRequestData: its tokens and block table as int32, its params, and
    a margin for the field names and scalars."""
    return 4 * num_tokens + 4 * cdiv(num_tokens, block_size) + params_bytes + 512


def pack_i32(values: list[int]) -> bytes:
    """Little-endian int32 bytes (protocol.TOKEN) of a list of ints; array() is several times faster
    than numpy's conversion for the lists of one step."""
    packed = array("i", values)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def pack_i64(values: list[int]) -> bytes:
    """Little-endian int64 bytes (protocol.HANDLE) of a list of ints."""
    packed = array("q", values)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int) -> None:
        for name in ("max_model_len", "max_num_batched_tokens"):
            if getattr(config, name) is None:
                raise ValueError(f"the scheduler needs config.{name}; set it or call EngineConfig.finalize()")
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.policy = config.scheduling_policy
        # vLLM's long_prefill_token_threshold: one prompt's chunk per step is capped, so that a long
        # prompt shares its steps with other prefills and decodes instead of taking the whole budget.
        self.max_prefill_chunk = config.long_prefill_token_threshold or config.max_num_batched_tokens
        # A step's new requests carry their prompts and block tables in full; their sum must fit the
        # broadcast ring with room for the columns, so a step admits new requests up to this many bytes
        # (always at least one: config.finalize checks that a max_model_len request fits).
        self.max_new_request_bytes = config.ring_bytes // 2
        self.waiting = create_request_queue(self.policy)
        self.kv_cache_manager = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if config.kv_events_config is not None and config.kv_events_config.enable_kv_cache_events:
            self.kv_cache_manager.enable_kv_events()
        self.running: list[Request] = []
        self.requests: dict[int, Request] = {}      # every unfinished request by handle
        self.step = 0
        self.num_preemptions = 0
        # Executors must drop these (finished, aborted, preempted); sent with the next step that runs.
        self._dropped_reqs: list[int] = []
        # News for the next EngineOutputs.
        self._finished_reqs: list[int] = []
        self._finish_reasons: list[int] = []
        self._stop_reasons: list[int | None] = []
        self._first_scheduled: list[tuple[int, int, float]] = []
        self._expected_samples: dict[int, int] = {}     # step -> requests it brings to a sample
        # Async scheduling: schedule() may run while the previous step is still executing. A request whose
        # sample is in flight is scheduled as if that token were known (the executors append it
        # themselves); one whose remaining tokens are all in flight waits.
        self.async_scheduling = config.async_scheduling
        self._errors: list[tuple[int, str]] = []
        # Structured outputs: requests wait in `compiling` (outside the queue, so they block nobody) until
        # their grammar is ready; `structured` holds the unfinished ones with a matcher.
        self.grammars = GrammarManager(config)
        self.compiling: list[Request] = []
        self.structured: dict[int, Request] = {}
        self._step_columns: tuple[list[int], list[int], list[int]] = ([], [], [])
        # Speculative decoding: drafts, acceptance and its counters; block-table cuts for the executors.
        spec = config.speculative_config
        self.speculator = Speculator(spec) if spec is not None else None
        self._truncated_tables: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ requests in and out
    def add_request(self, msg: AddRequest) -> None:
        """Queue a request. ValueError when it could never run (empty prompt, prompt + 1 token over
        max_model_len, or more KV blocks than the pool has) or when its handle is in use."""
        if msg.req in self.requests:
            raise ValueError(f"request handle {msg.req} is already in use")
        if msg.pooling is not None:
            raise ValueError(f"request {msg.req} asks for pooling (an embedding), but this engine runs a "
                             "generative model")
        request = Request.from_add_request(msg, self.max_model_len)
        # The last sampled token is never computed, so a request holds at most max_num_tokens - 1 slots.
        blocks_needed = cdiv(request.max_num_tokens - 1, self.block_size)
        usable = self.kv_cache_manager.block_pool.num_blocks - 1
        if blocks_needed > usable:
            raise ValueError(
                f"request {msg.req} may grow to {request.max_num_tokens} tokens, which needs "
                f"{blocks_needed} KV blocks of {self.block_size} tokens; the KV cache has {usable}"
            )
        request.wire_bytes = new_request_bytes_bound(request.max_num_tokens, self.block_size,
                                                     len(_params_size(msg.params)))
        self.kv_cache_manager.hash_new_blocks(request)
        self.requests[request.req] = request
        if msg.params.structured_outputs is not None:
            request.grammar = self.grammars.submit(msg.params.structured_outputs, msg.eos_token_ids)
            self.compiling.append(request)
            return
        self.waiting.add(request)

    def abort_requests(self, reqs: Iterable[int]) -> None:
        """Abort requests by handle; unknown or already finished handles are ignored."""
        aborted_running = False
        for handle in reqs:
            request = self.requests.get(int(handle))
            if request is None:
                continue
            if request.status is RUNNING:
                aborted_running = True
            elif request.grammar is not None and request.grammar.matcher is None:
                self.compiling.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, FINISHED_ABORTED)
        if aborted_running:
            self.running = [r for r in self.running if r.status is RUNNING]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def only_compiling(self) -> bool:
        """True when every unfinished request waits for its grammar: a step would have nothing to do."""
        return bool(self.compiling) and len(self.compiling) == len(self.requests)

    def has_pending_outputs(self) -> bool:
        """True while finished requests (e.g. aborts) wait to be reported in an EngineOutputs."""
        return bool(self._finished_reqs)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks

    @property
    def usage(self) -> float:
        return self.kv_cache_manager.usage

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        spec = self.speculator
        speculation = {} if spec is None else dict(
            spec_num_drafts=spec.num_drafts, spec_num_draft_tokens=spec.num_draft_tokens,
            spec_num_accepted_tokens=spec.num_accepted_tokens, spec_accepted_per_pos=list(spec.accepted_per_pos))
        return SchedulerStats(
            **speculation,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_free_blocks=kv.num_free_blocks,
            step=self.step,
        )

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        """Hand out this step's token budget; advance num_computed_tokens of everything scheduled."""
        self.step += 1
        if self.compiling:
            self._check_compiles()
        budget = self.max_num_batched_tokens
        block_size = self.block_size
        max_chunk = self.max_prefill_chunk
        allocate_slots = self.kv_cache_manager.allocate_slots
        # The batch as parallel columns: running requests first, in running order, then new ones.
        handles: list[int] = []
        counts: list[int] = []
        computed: list[int] = []
        new_block_ids: list[tuple[int, bytes]] = []
        num_samples = 0
        sampling: set[int] = set()      # running requests this step brings to a sample
        preempted = False
        speculator = self.speculator
        drafting = speculator is not None and speculator.batch_allows(len(self.running))
        drafted: list[Request] = []
        # a structured request's drafts need a grammar mask each: at most one full batch of extra rows
        mask_rows = self.max_num_seqs - len(self.running)

        add_handle, add_count, add_computed = handles.append, counts.append, computed.append
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            num_computed = request.num_computed_tokens
            num_tokens = len(request.all_token_ids)
            if self.async_scheduling and request.num_in_flight:
                if request.grammar is not None or (drafting and not speculator.paused(request)):
                    i += 1          # its next mask (or draft) depends on the token in flight: it waits
                    continue
                num_tokens += request.num_in_flight
                if num_tokens >= request.max_num_tokens:
                    i += 1          # its last token is in flight: it finishes when that arrives
                    continue
            n = num_tokens - num_computed
            drafts = ()
            if drafting and n == 1 and not request.num_in_flight:
                limit = min(budget, max_chunk, request.max_num_tokens - num_tokens) - 1
                if request.grammar is not None:
                    limit = min(limit, mask_rows)
                drafts = speculator.propose(request, limit) if limit > 0 else ()
                n += len(drafts)
            if n > budget:
                n = budget
            if n > max_chunk:
                n = max_chunk
            # Most decode steps fit in the last block's free room and need no allocation at all.
            if num_computed + n > len(request.blocks) * block_size:
                new_blocks = allocate_slots(request, n)
                if new_blocks is None and drafts:       # short of blocks: no speculation, no preemption
                    drafts, n = (), n - len(drafts)
                    new_blocks = allocate_slots(request, n)
                if new_blocks is None:
                    new_blocks, i, lost_samples = self._preempt_for(request, n, i, handles, counts,
                                                                    computed, new_block_ids, sampling)
                    budget = self.max_num_batched_tokens - sum(counts)
                    num_samples -= lost_samples
                    preempted = True
                    if new_blocks is None:
                        continue    # it preempted itself; running[i] is now the next request
                if new_blocks:
                    new_block_ids.append((request.req, pack_i32([b.block_id for b in new_blocks])))
            add_handle(request.req)
            add_count(n)
            add_computed(num_computed)
            if drafts:
                request.spec_token_ids = drafts
                drafted.append(request)
                if request.grammar is not None:
                    mask_rows -= len(drafts)
            # Advanced at schedule time, as vLLM does; a victim taken out of the batch is rolled back.
            request.num_computed_tokens = num_computed + n
            if num_computed + n == num_tokens + len(drafts):
                num_samples += 1
                request.num_in_flight += 1
                sampling.add(request.req)
            budget -= n
            i += 1

        new_reqs: list[NewRequestData] = []
        # After a preemption the pool is short: admitting new work would only churn.
        if not preempted:
            budget, num_samples = self._schedule_waiting(budget, num_samples, handles, counts, computed,
                                                         new_reqs)

        total = self.max_num_batched_tokens - budget
        if num_samples:
            self._expected_samples[self.step] = num_samples
        self._step_columns = (handles, counts, computed)
        # Drops ride on a step that reaches the executors; an empty step is skipped by the engine loop.
        dropped = b""
        truncated: list[tuple[int, int]] = []
        if total and self._dropped_reqs:
            dropped = pack_i64(self._dropped_reqs)
            self._dropped_reqs = []
        if total and self._truncated_tables:
            truncated, self._truncated_tables = self._truncated_tables, []
        return SchedulerOutput(
            step=self.step,
            new_reqs=new_reqs,
            reqs=pack_i64(handles),
            num_scheduled_tokens=pack_i32(counts),
            num_computed_tokens=pack_i32(computed),
            new_block_ids=new_block_ids,
            finished_reqs=dropped,
            total_num_scheduled_tokens=total,
            drafts=draft_tokens(drafted, handles) if drafted else None,
            truncated_block_tables=truncated,
        )

    def _check_compiles(self) -> None:
        """Requests whose grammar is ready join the queue; failed or overdue compiles end their request."""
        still = []
        for request in self.compiling:
            error = self.grammars.poll(request.grammar, request.eos_token_ids)
            if error is not None:
                self._finish(request, FINISHED_ERROR, error)
            elif request.grammar.matcher is None:
                still.append(request)
            else:
                self.structured[request.req] = request
                self.waiting.add(request)
        self.compiling = still

    def grammar_rows(self) -> GrammarRows | None:
        """The token masks of the last schedule()'s rows that sample under a grammar (None: no such row).
        O(batch) only while structured requests exist; the fill itself is one batched call."""
        structured = self.structured
        if not structured:
            return None
        handles, counts, computed = self._step_columns
        positions, matchers, drafts = [], [], []
        for position, handle in enumerate(handles):
            request = structured.get(handle)
            if request is None or (computed[position] + counts[position]
                                   != len(request.all_token_ids) + len(request.spec_token_ids)):
                continue
            if not request.grammar.terminated:       # a finished grammar (ignore_eos) samples freely
                positions.append(position)
                matchers.append(request.grammar.matcher)
                drafts.append(request.spec_token_ids)
        if not matchers:
            return None
        return self.grammars.fill(positions, matchers, drafts)

    def _schedule_waiting(
        self,
        budget: int,
        num_samples: int,
        handles: list[int],
        counts: list[int],
        computed: list[int],
        new_reqs: list[NewRequestData],
    ) -> tuple[int, int]:
        kv = self.kv_cache_manager
        waiting = self.waiting
        running = self.running
        room = self.max_new_request_bytes
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            request = waiting.peek()
            if request.num_in_flight:
                break       # preempted while its last step ran: back once that step's sample is applied
            if request.wire_bytes > room and new_reqs:
                break       # the broadcast ring's share is spent: the rest go with the next steps
            room -= request.wire_bytes
            hit_blocks, num_hit_tokens = kv.get_computed_blocks(request)
            num_tokens = len(request.all_token_ids)
            n = min(num_tokens - num_hit_tokens, budget, self.max_prefill_chunk)
            if kv.allocate_slots(request, n, hit_blocks) is None:
                break       # head-of-line: later requests wait for blocks too
            waiting.pop()
            if request.scheduled_ts is None:
                request.scheduled_ts = time.monotonic()
                request.num_cached_tokens = num_hit_tokens
                self._first_scheduled.append((request.req, num_hit_tokens, request.scheduled_ts))
            new_reqs.append(self._new_request_data(request, num_hit_tokens))
            request.status = RUNNING
            running.append(request)
            handles.append(request.req)
            counts.append(n)
            computed.append(num_hit_tokens)
            request.num_computed_tokens = num_hit_tokens + n
            if num_hit_tokens + n == num_tokens:
                num_samples += 1
                request.num_in_flight += 1
            budget -= n
        return budget, num_samples

    def _preempt_for(
        self,
        request: Request,
        num_new_tokens: int,
        index: int,
        handles: list[int],
        counts: list[int],
        computed: list[int],
        new_block_ids: list[tuple[int, bytes]],
        sampling: set[int],
    ) -> tuple[Sequence[KVCacheBlock] | None, int, int]:
        """Preempt running requests, lowest priority first, until `request` (running[index]) gets its
        blocks or is itself the one preempted. A victim this step already scheduled leaves the batch.

        Returns (the new blocks or None, the index of the next request to look at, samples lost)."""
        running = self.running
        lost_samples = 0
        while True:
            victim = pick_preemption_victim(running, self.policy)
            if running.index(victim) < index:
                index -= 1
            if victim.req in handles:
                at = handles.index(victim.req)
                victim.num_computed_tokens = computed[at]
                if victim.req in sampling:
                    sampling.discard(victim.req)
                    lost_samples += 1
                    victim.num_in_flight -= 1
                for column in (handles, counts, computed):
                    del column[at]
                new_block_ids[:] = [entry for entry in new_block_ids if entry[0] != victim.req]
            self._preempt(victim)
            if victim is request:
                return None, index, lost_samples
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            if new_blocks is not None:
                return new_blocks, index, lost_samples

    def _new_request_data(self, request: Request, num_computed_tokens: int) -> NewRequestData:
        prompt = request.prompt_token_bytes
        if prompt is None:
            prompt = pack_i32(request.prompt_token_ids)
        return NewRequestData(
            req=request.req,
            prompt_token_ids=prompt,
            output_token_ids=pack_i32(request.output_token_ids) if request.num_output_tokens else b"",
            params=request.params,
            eos_token_ids=request.eos_token_ids,
            block_ids=pack_i32([b.block_id for b in request.blocks]),
            num_computed_tokens=num_computed_tokens,
        )

    def _preempt(self, request: Request) -> None:
        """Free a running request's blocks and queue it for recompute, keeping its tokens."""
        self.running.remove(request)
        request.spec_token_ids = ()         # rejected or not, its drafts' slots go with its blocks
        # async: a step in flight may have computed past the known tokens, which have no block hash yet
        request.num_computed_tokens = min(request.num_computed_tokens, len(request.all_token_ids))
        self.kv_cache_manager.free(request)
        request.status = PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(request)
        self._dropped_reqs.append(request.req)

    # ------------------------------------------------------------------ results of a step
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        runner_output: ModelRunnerOutput | None,
    ) -> EngineOutputs:
        """Take a step's sampled tokens (None when it scheduled nothing), apply the stop checks, free
        the finished requests' blocks, and report the step's news with the aborts since the last one."""
        now = time.monotonic()
        out_reqs = out_tokens = b""
        logprobs = prompt_logprobs = []
        if runner_output is not None:
            out_reqs, out_tokens = runner_output.reqs, runner_output.sampled_token_ids
            logprobs, prompt_logprobs = runner_output.logprobs, runner_output.prompt_logprobs
            if runner_output.step != scheduler_output.step:
                raise RuntimeError(f"runner output of step {runner_output.step} given for step "
                                   f"{scheduler_output.step}")
            if runner_output.num_sampled:     # speculative decoding: several tokens for some requests
                out_reqs, out_tokens, logprobs, gone = self._apply_verified(scheduler_output.step, runner_output,
                                                                            now)
                prompt_logprobs = [lp for lp in prompt_logprobs if lp.req not in gone]
            else:
                gone = self._apply_samples(scheduler_output.step, unpack(out_reqs, HANDLE).tolist(),
                                           unpack(out_tokens, TOKEN).tolist(), now)
                if gone:
                    # Requests aborted while their step ran: their tokens are not news any more.
                    keep = [i for i, h in enumerate(unpack(out_reqs, HANDLE).tolist()) if h not in gone]
                    out_reqs = unpack(out_reqs, HANDLE)[keep].tobytes()
                    out_tokens = unpack(out_tokens, TOKEN)[keep].tobytes()
                    logprobs = [lp for lp in logprobs if lp.req not in gone]
                    prompt_logprobs = [lp for lp in prompt_logprobs if lp.req not in gone]
        elif scheduler_output.total_num_scheduled_tokens:
            raise RuntimeError(f"step {scheduler_output.step} scheduled tokens but got no runner output")

        outputs = EngineOutputs(
            reqs=out_reqs,
            new_token_ids=out_tokens,
            finished_reqs=pack_i64(self._finished_reqs),
            finish_reasons=bytes(self._finish_reasons),
            stop_reasons=self._stop_reasons,
            first_scheduled=self._first_scheduled,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            timestamp=now,
            stats=self.make_stats(),
            errors=self._errors,
        )
        self._finished_reqs, self._finish_reasons, self._stop_reasons = [], [], []
        self._first_scheduled, self._errors = [], []
        return outputs

    def _apply_samples(self, step: int, handles: list[int], tokens: list[int], now: float) -> set[int]:
        """Append each sampled token and run the stop checks; return the handles no longer known."""
        expected = self._expected_samples.pop(step, 0)
        if len(handles) != expected:
            raise RuntimeError(
                f"the runner sampled {len(handles)} tokens, but step {step} brought "
                f"{expected} requests to the end of their known tokens"
            )
        requests = self.requests
        block_size = self.block_size
        kv = self.kv_cache_manager
        caching = kv.enable_caching
        gone: set[int] = set()
        any_finished = False
        for handle, token in zip(handles, tokens, strict=True):
            request = requests.get(handle)
            if request is None:
                gone.add(handle)
                continue
            request.num_in_flight -= 1
            if request.first_token_ts is None:
                request.first_token_ts = now
            request.last_token_ts = now
            finished = self._take_token(request, token)
            if finished is not None:
                self._finish_sampled(request, finished, token)
                any_finished = True
            elif caching:
                if len(request.all_token_ids) % block_size == 0:
                    kv.hash_new_blocks(request)
                # Blocks this step completed become hits for others now, not at the next allocation.
                if request.num_computed_tokens >= (request.num_cached_blocks + 1) * block_size:
                    kv.cache_computed_blocks(request)
        if any_finished:
            self.running = [r for r in self.running if r.status is RUNNING]
        return gone

    def _apply_verified(self, step: int, out: ModelRunnerOutput,
                        now: float) -> tuple[bytes, bytes, list[RequestLogprobs], set[int]]:
        """_apply_samples for a step that verified drafts: each request's accepted run, token by token (what
        follows a stop is dropped), then its rejected drafts undone. Returns the (repeated) handles, the
        tokens and the logprobs that are news, and the handles no longer known."""
        handles = unpack(out.reqs, HANDLE).tolist()
        counts = unpack(out.num_sampled, TOKEN).tolist()
        tokens = unpack(out.sampled_token_ids, TOKEN).tolist()
        expected = self._expected_samples.pop(step, 0)
        if len(handles) != expected or len(counts) != expected or sum(counts) != len(tokens):
            raise RuntimeError(f"the runner reported {len(handles)} requests with {len(counts)} counts and "
                               f"{len(tokens)} tokens for step {step}, which brought {expected} to a sample")
        requests, block_size, kv = self.requests, self.block_size, self.kv_cache_manager
        news_handles: list[int] = []
        news_tokens: list[int] = []
        kept: dict[int, int] = {}
        gone = {handle for handle in handles if handle not in requests}
        any_finished = False
        start = 0
        for handle, count in zip(handles, counts):
            run = tokens[start:start + count]
            start += count
            request = requests.get(handle)
            if request is None:
                continue
            request.num_in_flight -= 1
            if request.first_token_ts is None:
                request.first_token_ts = now
            request.last_token_ts = now
            drafts = request.spec_token_ids
            if drafts:
                request.spec_token_ids = ()
                self.speculator.record(request, len(drafts), count - 1)
                request.num_computed_tokens -= len(drafts) + 1 - count
            finished = None
            num_kept = 0
            for token in run:
                num_kept += 1
                finished = self._take_token(request, token)
                if finished is not None:
                    break
            news_handles.extend([handle] * num_kept)
            news_tokens.extend(run[:num_kept])
            kept[handle] = num_kept
            if kv.enable_caching and len(request.all_token_ids) // block_size > len(request.block_hashes):
                kv.hash_new_blocks(request)         # the run may have filled blocks, the last one too
            if finished is not None:
                self._finish_sampled(request, finished, run[num_kept - 1])
                any_finished = True
                continue
            if drafts and kv.free_tail(request, cdiv(len(request.all_token_ids), block_size)):
                self._truncated_tables.append((handle, len(request.blocks)))
            if (kv.enable_caching and request.status is RUNNING
                    and request.num_computed_tokens >= (request.num_cached_blocks + 1) * block_size):
                kv.cache_computed_blocks(request)
        if any_finished:
            self.running = [r for r in self.running if r.status is RUNNING]
        logprobs = [first_rows(lp, kept[lp.req]) for lp in out.logprobs if lp.req in kept]
        return pack_i64(news_handles), pack_i32(news_tokens), logprobs, gone

    def _take_token(self, request: Request, token: int) -> RequestStatus | None:
        """Append a sampled token, advance the request's grammar; the finished status it causes, or None."""
        finished = request.append_token(token)
        grammar = request.grammar
        if grammar is not None and not grammar.terminated:
            finished = self._advance_grammar(request, token, finished)
        return finished

    def _finish_sampled(self, request: Request, status: RequestStatus, token: int) -> None:
        if request.status is PREEMPTED:       # async: preempted while its last step ran
            self.waiting.remove(request)
        self._finish(request, status, self._grammar_error(request, token, status))

    def _advance_grammar(self, request: Request, token: int, finished: RequestStatus | None) -> RequestStatus | None:
        """Feed a sampled token to the request's matcher. The mask makes a refusal impossible, so one is an
        engine fault: it ends this request with an error, never the process. A grammar that has ended (it
        took an EOS) ends the request even under min_tokens (the grammar wins), unless ignore_eos."""
        if not self.grammars.accept(request.grammar, token):
            return FINISHED_ERROR
        if finished is None and request.grammar.terminated and not request.params.ignore_eos:
            return FINISHED_STOPPED
        return finished

    @staticmethod
    def _grammar_error(request: Request, token: int, finished: RequestStatus) -> str | None:
        if finished is not FINISHED_ERROR:
            return None
        print(f"ringserve: request {request.req}: the grammar refused sampled token {token}", file=sys.stderr)
        return f"structured_outputs: internal error: the grammar refused the sampled token {token}"

    def _finish(self, request: Request, status: RequestStatus, error: str | None = None) -> None:
        """Mark a request finished, free its blocks (tail first) and queue the news; the caller takes it
        out of `running` (in one pass for all the step's finishes). FINISHED_ERROR carries `error`."""
        if request.status is RUNNING:
            self._dropped_reqs.append(request.req)
        request.status = status
        # as after a serial step, the last token's keys and values count as not computed (under async
        # scheduling a step in flight may be computing them, or past the known tokens)
        request.num_computed_tokens = min(request.num_computed_tokens, len(request.all_token_ids) - 1)
        self.kv_cache_manager.free(request)
        del self.requests[request.req]
        if request.grammar is not None:
            self.structured.pop(request.req, None)
        if self.speculator is not None:
            self.speculator.finish(request)
        if status is FINISHED_ERROR:
            self._errors.append((request.req, error or "the request failed"))
        self._finished_reqs.append(request.req)
        self._finish_reasons.append(FINISH_CODES[status])
        self._stop_reasons.append(request.stop_reason)

