"""EngineCore: one step of the engine, independent of where it runs.

A step drains nothing itself: the scheduler process (`engine.core.main`) feeds it the frontend's messages
(`handle`), then calls `step()`: schedule, execute on the executors, update the requests from the result,
and return the batch of outputs for the frontend.
"""

from __future__ import annotations

import sys
import time

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
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


class EngineCore:
    """The step loop's logic: the scheduler plus whatever executes the model."""

    def __init__(self, config: EngineConfig, executor: Executor) -> None:
        self.config = config
        self.executor = executor
        self.scheduler = Scheduler(config, executor.num_blocks)
        self.step_count = 0
        self._rejected: list[int] = []

    def handle(self, msg) -> ControlReply | None:
        """Apply one message from the frontend; control calls return their reply."""
        if isinstance(msg, AddRequest):
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
            elif call.method in ("start_profile", "stop_profile"):
                result = self.executor.call(call.method, **call.args)
            elif call.method == "shutdown":
                result = "bye"
            else:
                raise ValueError(f"unknown control call {call.method!r}")
            return ControlReply(call_id=call.call_id, ok=True, result=result)
        except ValueError as e:
            return ControlReply(call_id=call.call_id, ok=False, result=str(e))

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return s.has_unfinished_requests() or s.has_pending_outputs()

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
        so = self.scheduler.schedule()
        self.step_count += 1
        result = None
        if so.total_num_scheduled_tokens or len(so.finished_reqs) or so.new_reqs:
            result = self.executor.execute(so)
        outputs = self.scheduler.update_from_output(so, result)
        if len(outputs.reqs) or len(outputs.finished_reqs) or outputs.first_scheduled or outputs.prompt_logprobs:
            return outputs
        return None
