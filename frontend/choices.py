"""One engine request of an API request (a "choice"): its text, stop strings, timings and outcome.

An API request with n samples (or several prompts) becomes several engine requests, one per choice, each
with its own id and params. The runner (frontend/runner.py) feeds each engine step to `Choice.process`,
which detokenizes it, finds stop strings (the runner then ends the engine request early) and records the
request's metrics and profile events.
"""

from __future__ import annotations

from engine.client.detokenizer import Detokenizer
from engine.outputs import RequestDelta, TokenLogprobs
from engine.sampling_params import SamplingParams
from frontend.metrics import EngineMetrics, ModelMetrics, RequestEventLog


class Choice:
    """State of one engine request while it streams; `process` is called once per engine step."""

    __slots__ = ("index", "request_id", "prompt_token_ids", "params", "arrival_time", "detokenizer",
                 "pending_text", "num_output_tokens", "finish_reason", "stop_reason", "num_cached_tokens",
                 "scheduled_time", "first_token_time", "last_token_time", "texts", "token_ids", "logprobs",
                 "prompt_logprobs", "chunk_head", "chunk_tail", "text_offset", "prompt_position", "_model_metrics",
                 "_metrics", "_events")

    def __init__(self, index: int, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 detokenizer: Detokenizer, arrival_time: float, metrics: ModelMetrics,
                 events: RequestEventLog, *, keep_output: bool, echo_text: str = ""):
        self.index = index
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = arrival_time
        self.detokenizer = detokenizer
        self.pending_text = echo_text          # sent ahead of the first generated text (echo)
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.num_cached_tokens = 0
        self.scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # Whole-output accumulators, only for non-streaming responses (streams send deltas as they come).
        self.texts: list[str] | None = [] if keep_output else None
        self.token_ids: list[int] | None = [] if keep_output else None
        self.logprobs: list[TokenLogprobs] | None = [] if keep_output else None
        self.prompt_logprobs: list[TokenLogprobs | None] | None = [] if keep_output else None
        self.chunk_head = b""                  # the constant parts of this choice's SSE text chunk
        self.chunk_tail = b""
        self.text_offset = 0                   # characters sent so far (completions logprobs' text_offset)
        self.prompt_position = 0               # prompt logprobs streamed so far (echo)
        self._model_metrics = metrics
        self._metrics: EngineMetrics | None = None     # the series of the engine that runs it: first delta
        self._events = events
        if events.active:
            events.record({"event": "arrival", "request_id": request_id, "time": arrival_time,
                           "prompt_tokens": len(prompt_token_ids)})

    def process(self, delta: RequestDelta) -> str:
        """Take one step's news; return the text it makes final. Sets finish_reason when the choice ends."""
        ids = delta.new_token_ids
        metrics = self._metrics
        if metrics is None:
            metrics = self._engine_metrics(delta.engine)
        if ids:
            now = delta.timestamp
            if self.first_token_time is None:
                self.first_token_time = now
                metrics.time_to_first_token.observe(max(now - self.arrival_time, 0.0))
            else:
                metrics.inter_token_latency.observe(max(now - self.last_token_time, 0.0))
            self.last_token_time = now
            self.num_output_tokens += len(ids)
            metrics.generation_tokens += len(ids)
        if delta.scheduled_time is not None and self.scheduled_time is None:
            self.scheduled_time = delta.scheduled_time
            if delta.num_cached_tokens is not None:
                self.num_cached_tokens = delta.num_cached_tokens
        finished = delta.finished
        # An engine "stop" is always an EOS or stop token id: the last token, which is not rendered.
        taken = self.detokenizer.num_tokens
        text = self.detokenizer.update(ids, finished=finished,
                                       stop_terminated=finished and delta.finish_reason == "stop")
        taken = self.detokenizer.num_tokens - taken
        if taken < len(ids):          # a stop string ended the output inside this step's tokens
            self.num_output_tokens -= len(ids) - taken
            self._metrics.generation_tokens -= len(ids) - taken
            del ids[taken:]
            if delta.logprobs:
                del delta.logprobs[taken:]
        if self.pending_text:
            text, self.pending_text = self.pending_text + text, ""
        if self.texts is not None:
            self._keep(text, delta)
        if self.detokenizer.stop_string is not None:
            self.finish("stop", self.detokenizer.stop_string)
        elif finished:
            self.finish(delta.finish_reason or "abort", delta.stop_reason)
        return text

    def _keep(self, text: str, delta: RequestDelta) -> None:
        if text:
            self.texts.append(text)
        self.token_ids.extend(delta.new_token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.prompt_logprobs:
            self.prompt_logprobs.extend(delta.prompt_logprobs)

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self.stop_reason = stop_reason
        metrics = self._metrics or self._engine_metrics(0)     # a request that ended before any step
        metrics.record_finished(reason, self.arrival_time, self.scheduled_time, self.first_token_time,
                                self.last_token_time)
        if self._events.active:
            self._events.record({
                "event": "finish", "request_id": self.request_id, "finish_reason": reason,
                "arrival": self.arrival_time, "scheduled": self.scheduled_time,
                "first_token": self.first_token_time, "last_token": self.last_token_time,
                "prompt_tokens": len(self.prompt_token_ids), "output_tokens": self.num_output_tokens,
                "cached_tokens": self.num_cached_tokens,
            })

    def _engine_metrics(self, engine: int) -> EngineMetrics:
        """The engine's series, picked once (the engine takes the prompt with the request's first step)."""
        self._metrics = self._model_metrics.engine(engine)
        self._metrics.prompt_tokens += len(self.prompt_token_ids)
        return self._metrics

    @property
    def text(self) -> str:
        return "".join(self.texts or ())
