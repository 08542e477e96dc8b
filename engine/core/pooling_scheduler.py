"""Schedulers for pooling models (embeddings): prefill-only requests that finish with one vector each.

A pooling request is a prompt and nothing else: it never samples, so it holds at most its prompt's tokens
and ends in the step that computes its last prompt token, with the vector the executor pooled for it.

- `PoolingScheduler`: a decoder served with `--runner pooling`. The generation scheduler's schedule() runs
  unchanged (token budget, chunked prefill, prefix-cache hits, preemption under a full KV cache); only
  admission (prompt-length bounds) and the result of a step (vectors instead of sampled tokens) differ.
- `EncoderScheduler`: an encoder (BERT family). Attention is bidirectional, so a prompt is computed whole
  in one step; nothing is cached between steps, so there are no KV blocks and the executors keep no state:
  a step packs as many whole waiting prompts as the token budget, max_num_seqs and the broadcast ring allow.
"""

from __future__ import annotations

import time

from engine.config import EngineConfig
from engine.core.kv_cache_manager import cdiv
from engine.core.request import Request
from engine.core.scheduler import (
    FINISHED_STOPPED,
    RUNNING,
    Scheduler,
    _params_size,
    new_request_bytes_bound,
    pack_i32,
    pack_i64,
)
from engine.messages import (
    HANDLE,
    AddRequest,
    EngineOutputs,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
    unpack,
)


def make_scheduler(config: EngineConfig, num_blocks: int) -> Scheduler:
    """The scheduler for config.runner: generation, or pooling for a decoder or an encoder."""
    if config.runner != "pooling":
        return Scheduler(config, num_blocks)
    return EncoderScheduler(config, num_blocks) if config.is_encoder else PoolingScheduler(config, num_blocks)


class PoolingScheduler(Scheduler):
    def add_request(self, msg: AddRequest) -> None:
        """Queue a pooling request. ValueError for a generation request, an empty prompt, one over
        max_model_len or over the KV cache, or a handle in use."""
        if msg.pooling is None:
            raise ValueError(f"request {msg.req} asks for generation, but this engine runs a pooling model "
                             "(embeddings)")
        if msg.req in self.requests:
            raise ValueError(f"request handle {msg.req} is already in use")
        num_tokens = len(msg.prompt_token_ids) // 4
        if num_tokens > self.max_model_len:
            raise ValueError(f"request {msg.req}: the prompt has {num_tokens} tokens, more than max_model_len "
                             f"({self.max_model_len})")
        # Request's bound leaves room for one generated token; a pooling prompt may fill max_model_len.
        request = Request.from_add_request(msg, self.max_model_len + 1)
        request.max_num_tokens = request.num_prompt_tokens      # it never samples
        self._check_capacity(request)
        request.wire_bytes = new_request_bytes_bound(request.num_prompt_tokens, self.block_size,
                                                     len(_params_size(msg.params)))
        self.kv_cache_manager.hash_new_blocks(request)
        self.requests[request.req] = request
        self.waiting.add(request)

    def _check_capacity(self, request: Request) -> None:
        needed = cdiv(request.num_prompt_tokens, self.block_size)
        usable = self.kv_cache_manager.block_pool.num_blocks - 1
        if needed > usable:
            raise ValueError(f"request {request.req}: its {request.num_prompt_tokens} prompt tokens need {needed} "
                             f"KV blocks of {self.block_size} tokens; the KV cache has {usable}")

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput | None) -> EngineOutputs:
        """Finish every request the runner pooled, with its vector, and report them with the step's other
        news (aborts since the last step)."""
        now = time.monotonic()
        pooled_reqs = pooled = b""
        if runner_output is not None:
            if runner_output.step != scheduler_output.step:
                raise RuntimeError(f"runner output of step {runner_output.step} given for step "
                                   f"{scheduler_output.step}")
            handles = unpack(runner_output.reqs, HANDLE).tolist()
            expected = self._expected_samples.pop(scheduler_output.step, 0)
            if len(handles) != expected:
                raise RuntimeError(f"the runner pooled {len(handles)} requests, but step {scheduler_output.step} "
                                   f"brought {expected} to the end of their prompts")
            kept = [i for i, handle in enumerate(handles) if self._finish_pooled(handle, now)]
            if kept:
                self.running = [r for r in self.running if r.status is RUNNING]
            row_bytes = len(runner_output.pooled) // len(handles) if handles else 0
            pooled_reqs, pooled = _rows(runner_output.reqs, 8, kept), _rows(runner_output.pooled, row_bytes, kept)
        elif scheduler_output.total_num_scheduled_tokens:
            raise RuntimeError(f"step {scheduler_output.step} scheduled tokens but got no runner output")
        outputs = EngineOutputs(
            reqs=b"", new_token_ids=b"", finished_reqs=pack_i64(self._finished_reqs),
            finish_reasons=bytes(self._finish_reasons), stop_reasons=self._stop_reasons,
            first_scheduled=self._first_scheduled, logprobs=[], prompt_logprobs=[], timestamp=now,
            stats=self.make_stats(), errors=self._errors, pooled_reqs=pooled_reqs, pooled=pooled,
        )
        self._finished_reqs, self._finish_reasons, self._stop_reasons = [], [], []
        self._first_scheduled, self._errors = [], []
        return outputs

    def _finish_pooled(self, handle: int, now: float) -> bool:
        """End a request whose vector arrived; False when it is no longer known (aborted meanwhile)."""
        request = self.requests.get(handle)
        if request is None:
            return False
        request.num_in_flight -= 1
        request.first_token_ts = request.last_token_ts = now
        self.kv_cache_manager.cache_computed_blocks(request)    # every prompt block, the last one included
        self._finish(request, FINISHED_STOPPED)
        return True


class EncoderScheduler(PoolingScheduler):
    def __init__(self, config: EngineConfig, num_blocks: int) -> None:
        super().__init__(config, num_blocks)
        self.kv_cache_manager.enable_caching = False      # no KV cache: no block hashes to keep

    def _check_capacity(self, request: Request) -> None:
        pass        # no KV cache; config.finalize keeps max_model_len within the token budget

    def schedule(self) -> SchedulerOutput:
        """Whole waiting prompts, in queue order, while the budget, max_num_seqs and the ring allow."""
        self.step += 1
        budget = self.max_num_batched_tokens
        room = self.max_new_request_bytes
        handles: list[int] = []
        counts: list[int] = []
        new_reqs: list[NewRequestData] = []
        waiting, running = self.waiting, self.running
        while waiting and len(handles) < self.max_num_seqs:
            request = waiting.peek()
            n = request.num_prompt_tokens
            if n > budget or (request.wire_bytes > room and new_reqs):
                break
            waiting.pop()
            room -= request.wire_bytes
            budget -= n
            request.status = RUNNING
            request.num_computed_tokens = n
            request.num_in_flight = 1
            if request.scheduled_ts is None:
                request.scheduled_ts = time.monotonic()
                self._first_scheduled.append((request.req, 0, request.scheduled_ts))
            running.append(request)
            new_reqs.append(self._new_request_data(request, 0))
            handles.append(request.req)
            counts.append(n)
        if handles:
            self._expected_samples[self.step] = len(handles)
        self._dropped_reqs = []         # the executors keep nothing between steps: nothing to drop
        total = self.max_num_batched_tokens - budget
        return SchedulerOutput(
            step=self.step, new_reqs=new_reqs, reqs=pack_i64(handles), num_scheduled_tokens=pack_i32(counts),
            num_computed_tokens=pack_i32([0] * len(handles)), new_block_ids=[], finished_reqs=b"",
            total_num_scheduled_tokens=total,
        )


def _rows(data: bytes, row_bytes: int, keep: list[int]) -> bytes:
    """The rows `keep` of a packed array of fixed-size rows (all of it when nothing was dropped)."""
    if row_bytes == 0 or len(keep) * row_bytes == len(data):
        return data
    return b"".join(data[i * row_bytes:(i + 1) * row_bytes] for i in keep)


__all__ = ["EncoderScheduler", "PoolingScheduler", "make_scheduler"]
