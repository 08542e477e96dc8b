"""EngineCore: one step of the engine, independent of where it runs.

A step drains nothing itself: the scheduler process (`engine.core.main`) feeds it the frontend's messages
(`handle`), then calls `step()`: schedule, execute on the executors, update the requests from the result,
and return the batch of outputs for the frontend.

With config.async_scheduling the executors get step N+1 before step N's result is read: the scheduler's
work (update, schedule, encoding) then overlaps the executors' step instead of leaving them idle. Each
step() submits one step and applies the result of the one before; the outputs lag one step.
"""

from __future__ import annotations

import sys
import time
from collections import deque

from engine.config import EngineConfig
from engine.core.kv_events import make_publisher
from engine.core.pooling_scheduler import make_scheduler
from engine.executor.group import Executor
from engine.messages import (
    FINISH_ABORT,
    HANDLE,
    AbortRequests,
    AddRequest,
    ControlCall,
    ControlReply,
    EngineOutputs,
    pack,
    unpack,
)


COMPILE_POLL_S = 0.002          # how long a loop with only grammar compiles pending waits before it looks again

class EngineCore:
    """The step loop's logic: the scheduler plus whatever executes the model."""

    def __init__(self, config: EngineConfig, executor: Executor) -> None:
        self.config = config
        self.executor = executor
        self.scheduler = make_scheduler(config, executor.num_blocks)
        self.step_count = 0
        self._rejected: list[int] = []
        self._in_flight: deque = deque()           # async: submitted steps whose results are not applied
        self._stashed: deque = deque()             # async: outputs of steps drained before a control call
        self.kv_event_publisher = make_publisher(config)   # None unless --kv-events-config asks for it
        self.sleep_level = 0                       # vLLM's sleep mode: 0 awake, 1 KV freed, 2 weights too

    def close(self) -> None:
        self.scheduler.grammars.close()
        if self.kv_event_publisher is not None:
            self.kv_event_publisher.shutdown()
            self.kv_event_publisher = None

    def publish_kv_events(self) -> None:
        """The KV-cache events since the last call, as one batch (see engine.core.kv_events)."""
        events = self.scheduler.kv_cache_manager.take_kv_events()
        if events and self.kv_event_publisher is not None:
            self.kv_event_publisher.publish(events)

    def handle(self, msg) -> ControlReply | None:
        """Apply one message from the frontend; control calls return their reply."""
        if isinstance(msg, AddRequest):
            if self.sleep_level:              # a request for a sleeping engine wakes it
                self._wake_up()
            try:
                self.scheduler.add_request(msg)
            except ValueError as e:       # the client validates first; this is the last line of defence
                print(f"ringserve: request {msg.req} refused: {e}", file=sys.stderr)
                self._rejected.append(msg.req)
            return None
        if isinstance(msg, AbortRequests):
            self.scheduler.abort_requests(unpack(msg.reqs, HANDLE).tolist())
            return None
        return self.control(msg)

    def control(self, call: ControlCall) -> ControlReply:
        try:
            if call.method == "reset_prefix_cache":
                result = str(self.scheduler.reset_prefix_cache())
                self.publish_kv_events()
            elif call.method in ("start_profile", "stop_profile"):
                self._drain()
                result = self.executor.call(call.method, **call.args)
            elif call.method == "sleep":
                result = self._sleep(call.args.get("level", 1))
            elif call.method == "wake_up":
                result = self._wake_up()
            elif call.method == "shutdown":
                self._drain()
                result = "bye"
            else:
                raise ValueError(f"unknown control call {call.method!r}")
            return ControlReply(call_id=call.call_id, ok=True, result=result)
        except ValueError as e:
            return ControlReply(call_id=call.call_id, ok=False, result=str(e))

    def _sleep(self, level) -> str:
        """Free the KV cache (and at level 2 the weights) while no request is in the engine; its prefix
        cache is emptied, as the blocks it indexes lose their contents."""
        if level not in (1, 2) or isinstance(level, bool):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        self._drain()
        if self.scheduler.has_unfinished_requests() or self._stashed:
            raise ValueError(f"the engine has {len(self.scheduler.requests)} unfinished requests; it sleeps only "
                             "when idle")
        self.scheduler.reset_prefix_cache()
        self.publish_kv_events()
        result = self.executor.call("sleep", level=level)
        self.sleep_level = max(self.sleep_level, level)
        return result

    def _wake_up(self) -> str:
        if not self.sleep_level:
            return "awake"
        result = self.executor.call("wake_up", timeout=self.config.startup_timeout_s)
        self.sleep_level = 0
        return result

    @property
    def only_compiling(self) -> bool:
        """Every unfinished request waits for its grammar: the loop should wait briefly, not spin."""
        return self.scheduler.only_compiling and not self.scheduler.has_pending_outputs()

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return s.has_unfinished_requests() or s.has_pending_outputs() or bool(self._in_flight or self._stashed)

    def take_rejected(self) -> EngineOutputs | None:
        """Requests the scheduler refused, reported as aborted so that nobody waits for them."""
        if not self._rejected:
            return None
        rejected, self._rejected = self._rejected, []
        return EngineOutputs(
            reqs=b"", new_token_ids=b"", finished_reqs=pack(rejected, HANDLE),
            finish_reasons=bytes([FINISH_ABORT] * len(rejected)), stop_reasons=[None] * len(rejected),
            first_scheduled=[], logprobs=[], prompt_logprobs=[], timestamp=time.monotonic(),
            stats=self.scheduler.make_stats(),
        )

    def step(self) -> EngineOutputs | None:
        if self.config.async_scheduling:
            outputs = self._step_async()
        else:
            so = self.scheduler.schedule()
            so.grammar = self.scheduler.grammar_rows()   # structured outputs: this step's token masks
            self.step_count += 1
            result = None
            if so.total_num_scheduled_tokens or len(so.finished_reqs) or so.new_reqs:
                result = self.executor.execute(so)
            outputs = _news(self.scheduler.update_from_output(so, result))
        self.publish_kv_events()
        return outputs

    def _step_async(self) -> EngineOutputs | None:
        if self._stashed:
            return self._stashed.popleft()
        so = self.scheduler.schedule()
        so.grammar = self.scheduler.grammar_rows()       # structured outputs: this step's token masks
        self.step_count += 1
        if so.total_num_scheduled_tokens or len(so.finished_reqs) or so.new_reqs:
            self.executor.submit(so)
            self._in_flight.append(so)
            if len(self._in_flight) < 2:
                return None             # the pipeline fills: this step's result is applied next time
        elif not self._in_flight:
            return _news(self.scheduler.update_from_output(so, None))    # nothing ran: aborts only
        older = self._in_flight.popleft()
        return _news(self.scheduler.update_from_output(older, self.executor.collect(older)))

    def _drain(self) -> None:
        """Apply every submitted step's result (outputs kept for the next step() calls), so the executors'
        result ring holds nothing before a control call reads its reply from it."""
        while self._in_flight:
            older = self._in_flight.popleft()
            outputs = _news(self.scheduler.update_from_output(older, self.executor.collect(older)))
            if outputs is not None:
                self._stashed.append(outputs)


def _news(outputs: EngineOutputs) -> EngineOutputs | None:
    if len(outputs.reqs) or len(outputs.finished_reqs) or outputs.first_scheduled or outputs.prompt_logprobs:
        return outputs
    return None
