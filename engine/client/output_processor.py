"""Turning the engine's per-step outputs into per-request deltas, on the frontend's side.

`deltas_from_outputs` splits one EngineOutputs (parallel raw arrays for the whole batch) into one
RequestDelta per request; `RequestCollector` holds what a request's async consumer has not taken yet,
merging new deltas into the pending one (vLLM's output collector), so a consumer slower than the engine
gets several tokens per delta instead of a growing backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from engine.client.pooling import finish_vector
from engine.messages import FINISH_REASONS, FLOAT, HANDLE, TOKEN, EngineOutputs, Logprobs, unpack
from engine.outputs import EngineDeadError, RequestDelta, TokenLogprobs
from engine.sampling_params import PoolingParams


@dataclass(slots=True)
class RequestState:
    request_id: str
    collector: RequestCollector | None     # async face; None for the blocking face
    prompt_logprobs_started: bool = False
    pooling: PoolingParams | None = None   # a pooling request's params, resolved (normalize is a bool)


class RequestCollector:
    """One request's deltas not yet taken by its consumer, merged into one."""

    __slots__ = ("pending", "error", "event")

    def __init__(self) -> None:
        self.pending: RequestDelta | None = None
        self.error: EngineDeadError | None = None
        self.event = asyncio.Event()

    def put(self, delta: RequestDelta) -> None:
        pending = self.pending
        if pending is None:
            self.pending = delta
            self.event.set()
            return
        pending.new_token_ids.extend(delta.new_token_ids)
        if delta.logprobs:
            pending.logprobs = (pending.logprobs or []) + delta.logprobs
        if delta.prompt_logprobs:
            pending.prompt_logprobs = (pending.prompt_logprobs or []) + delta.prompt_logprobs
        if pending.num_cached_tokens is None:
            pending.num_cached_tokens = delta.num_cached_tokens
            pending.scheduled_time = delta.scheduled_time
        pending.finished = delta.finished
        pending.finish_reason = delta.finish_reason
        pending.stop_reason = delta.stop_reason
        pending.timestamp = delta.timestamp
        pending.error = delta.error
        pending.pooled = delta.pooled

    def fail(self, error: EngineDeadError) -> None:
        self.error = error
        self.event.set()

    async def get(self) -> RequestDelta:
        while self.pending is None:      # what arrived before a failure is still delivered first
            if self.error is not None:
                raise self.error
            self.event.clear()
            await self.event.wait()
        delta, self.pending = self.pending, None
        return delta


def deltas_from_outputs(out: EngineOutputs, by_handle: dict[int, RequestState],
                        forget: Callable[[int], None]) -> list[tuple[RequestState, RequestDelta]]:
    """One step's EngineOutputs as one RequestDelta per request still known (by_handle); finished requests
    are forgotten. News for handles no longer known (aborted by the caller) is dropped."""
    deltas: dict[int, RequestDelta] = {}
    states: dict[int, RequestState] = {}
    timestamp = out.timestamp

    def delta_for(handle: int) -> RequestDelta | None:
        delta = deltas.get(handle)
        if delta is None:
            state = by_handle.get(handle)
            if state is None:                      # aborted by us: the engine's news is stale
                return None
            delta = deltas[handle] = RequestDelta(state.request_id, [], timestamp=timestamp)
            states[handle] = state
        return delta

    for handle, token in zip(unpack(out.reqs, HANDLE).tolist(), unpack(out.new_token_ids, TOKEN).tolist()):
        delta = delta_for(handle)
        if delta is not None:
            delta.new_token_ids.append(token)
    for handle, cached, when in out.first_scheduled:
        delta = delta_for(handle)
        if delta is not None:
            delta.num_cached_tokens = cached
            delta.scheduled_time = when
    for entry in out.logprobs:
        delta = delta_for(entry.req)
        if delta is not None:
            delta.logprobs = token_logprobs(entry.logprobs)
    for entry in out.prompt_logprobs:
        delta = delta_for(entry.req)
        if delta is not None:
            rows = token_logprobs(entry.logprobs)
            state = states[entry.req]
            if not state.prompt_logprobs_started:
                state.prompt_logprobs_started = True
                rows = [None, *rows]
            delta.prompt_logprobs = rows
    if out.pooled_reqs:
        handles = unpack(out.pooled_reqs, HANDLE).tolist()
        vectors = unpack(out.pooled, FLOAT).reshape(len(handles), -1)
        for handle, vector in zip(handles, vectors):
            delta = delta_for(handle)
            if delta is not None:
                delta.pooled = finish_vector(vector, states[handle].pooling)
    errors = dict(out.errors) if out.errors else None
    finished = unpack(out.finished_reqs, HANDLE).tolist()
    for handle, reason, stop_reason in zip(finished, out.finish_reasons, out.stop_reasons):
        delta = delta_for(handle)
        if delta is not None:
            delta.finished = True
            delta.finish_reason = FINISH_REASONS[reason]
            delta.stop_reason = stop_reason
            if errors is not None:
                delta.error = errors.get(handle)
            forget(handle)
    return [(states[h], d) for h, d in deltas.items()]


def token_logprobs(lp: Logprobs) -> list[TokenLogprobs]:
    columns = lp.num_columns
    ids = unpack(lp.token_ids, TOKEN).reshape(-1, columns).tolist()
    values = unpack(lp.logprobs, FLOAT).reshape(-1, columns).tolist()
    ranks = unpack(lp.ranks, TOKEN).tolist()
    return [TokenLogprobs(i, v, r) for i, v, r in zip(ids, values, ranks)]
