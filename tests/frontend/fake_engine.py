"""FakeEngine: an in-process object with EngineClient's interface, for testing the frontend alone.

It "generates" deterministic tokens: greedy requests (temperature 0) spell out a fixed script text, so
tests can predict the output; sampled requests draw script tokens from a generator seeded by the request's
seed (reproducible when seeded). One step loop serves all running requests, like a real engine: every
`step_delay` seconds each running request gets one token. It honours max_tokens, min_tokens, ignore_eos,
stop_token_ids, max_model_len, logprobs and prompt_logprobs (made-up but self-consistent values: the
chosen token's logprob equals its entry among the top-k, ranks agree with the order), and records what it
was asked (submitted), what finished and what was aborted. die() kills it: in-flight streams raise
EngineDeadError, is_dead turns True, new requests fail at once.
"""

from __future__ import annotations

import asyncio
import random
import time

from engine.client.tokenizer import eos_token_ids, load_tokenizer
from engine.config import EngineConfig
from engine.messages import SchedulerStats
from engine.outputs import EngineDeadError, RequestDelta, TokenLogprobs
from engine.sampling_params import SamplingParams

SCRIPT = "The quick brown fox jumps over the lazy dog. "


class _FakeRequest:
    __slots__ = ("request_id", "prompt", "params", "queue", "arrival", "rng", "num_generated", "eos_at")

    def __init__(self, request_id, prompt, params, arrival, eos_at, entropy: random.Random):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrival = arrival
        self.rng = random.Random(params.seed if params.seed is not None else entropy.random())
        self.num_generated = 0
        self.eos_at = eos_at


class FakeEngine:
    def __init__(self, config: EngineConfig, *, step_delay: float = 0.0, eos_after: int | None = None,
                 num_blocks: int = 4096, script: str = SCRIPT, coalesce: bool = False):
        self.config = config.finalize()
        self.max_model_len = config.max_model_len
        self.block_size = config.block_size
        self.num_blocks = num_blocks
        tokenizer = load_tokenizer(config)
        self.script = tokenizer.backend_tokenizer.encode(script, add_special_tokens=False).ids
        self.eos_token_ids = eos_token_ids(config, tokenizer)
        self.step_delay = step_delay
        self.eos_after = eos_after              # greedy and sampled requests emit EOS after this many tokens
        self.coalesce = coalesce                # merge the steps a slow consumer has not taken yet into one
        self.running: dict[str, _FakeRequest] = {}
        self.submitted: list[tuple[str, list[int], SamplingParams]] = []
        self.finished: list[str] = []
        self.aborted: list[str] = []
        self.calls: list[tuple[str, dict]] = []
        self.started = self.shut_down = False
        self._dead: EngineDeadError | None = None
        self._stepper: asyncio.Task | None = None
        self._entropy = random.Random()
        self._step = 0
        self._prompt_tokens_seen = 0

    # ------------------------------------------------------------------ EngineClient's interface
    def start(self) -> None:
        self.started = True

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._dead

    @property
    def stats(self) -> SchedulerStats:
        in_use = sum(len(r.prompt) + r.num_generated for r in self.running.values())
        capacity = self.num_blocks * self.block_size
        return SchedulerStats(num_running=len(self.running), num_waiting=0,
                              kv_cache_usage=min(in_use / capacity, 1.0),
                              prefix_cache_queries=self._prompt_tokens_seen, prefix_cache_hits=0,
                              num_free_blocks=self.num_blocks - -(-in_use // self.block_size), step=self._step)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                       priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                       data_parallel_rank: int | None = None):
        if self._dead is not None:
            raise self._dead
        self._check(request_id, prompt_token_ids, params)
        self.submitted.append((request_id, list(prompt_token_ids), params))
        self._prompt_tokens_seen += len(prompt_token_ids)
        eos_at = None
        if self.eos_after is not None and not params.ignore_eos and self.eos_token_ids:
            eos_at = max(self.eos_after, params.min_tokens)
        request = _FakeRequest(request_id, list(prompt_token_ids), params, arrival_time or time.monotonic(),
                               eos_at, self._entropy)
        self.running[request_id] = request
        if self._stepper is None:
            self._stepper = asyncio.get_running_loop().create_task(self._run())
        try:
            while True:
                item = await request.queue.get()
                while self.coalesce and not isinstance(item, EngineDeadError) and not request.queue.empty():
                    item = _merge(item, request.queue.get_nowait())
                if isinstance(item, EngineDeadError):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if self.running.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self.running)

    def fail_unfinished(self, error: EngineDeadError) -> None:
        for request in self.running.values():
            request.queue.put_nowait(error)
        self.running.clear()

    async def abort(self, request_id: str) -> None:
        request = self.running.pop(request_id, None)
        if request is not None:
            self.aborted.append(request_id)
            request.queue.put_nowait(RequestDelta(request_id, [], finished=True, finish_reason="abort",
                                                  timestamp=time.monotonic()))

    async def call(self, method: str, **args) -> str:
        self.calls.append((method, args))
        return f"ok: {method}"

    async def shutdown(self) -> None:
        self.shut_down = True
        if self._stepper is not None:
            self._stepper.cancel()

    # ------------------------------------------------------------------ test controls
    def die(self, message: str = "executor 0 died (killed by signal 9)") -> None:
        self._dead = EngineDeadError(message)
        for request in self.running.values():
            request.queue.put_nowait(self._dead)
        self.running.clear()

    # ------------------------------------------------------------------ the fake model
    def _check(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if request_id in self.running:
            raise ValueError(f"request id {request_id!r} is already running")
        if not prompt:
            raise ValueError("the prompt is empty")
        if params.n != 1 or not params.is_resolved:
            raise ValueError("params must have n == 1 and be resolved")
        if params.max_tokens is not None and len(prompt) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len ({self.max_model_len})")
        if max(prompt) >= self.config.vocab_size or min(prompt) < 0:
            raise ValueError("prompt holds token ids outside the vocabulary")
        params.validate_against(vocab_size=self.config.vocab_size, max_logprobs=self.config.max_logprobs)

    async def _run(self) -> None:
        """Steps at the engine's own pace: when the event loop comes back late (a busy frontend), the steps
        a separate engine process would have run meanwhile are all delivered at once."""
        try:
            last = time.monotonic()
            while self.running:
                await asyncio.sleep(self.step_delay)
                now = time.monotonic()
                steps = min(max(int((now - last) / self.step_delay), 1), 64) if self.step_delay else 1
                last = now if steps == 1 else last + steps * self.step_delay
                for _ in range(steps):
                    self._step += 1
                    for request in list(self.running.values()):
                        delta = self._advance(request, now)
                        if delta.finished:
                            del self.running[request.request_id]
                            self.finished.append(request.request_id)
                        request.queue.put_nowait(delta)
        finally:
            self._stepper = None

    def _advance(self, request: _FakeRequest, now: float) -> RequestDelta:
        params = request.params
        k = request.num_generated
        if params.greedy:
            token = self.script[k % len(self.script)]
        else:
            token = request.rng.choice(self.script)
        finish_reason = stop_reason = None
        if request.eos_at is not None and k == request.eos_at:
            token = self.eos_token_ids[0]
            finish_reason = "stop"
        elif token in params.stop_token_ids and k + 1 > params.min_tokens:
            finish_reason, stop_reason = "stop", token
        elif (params.max_tokens is not None and k + 1 >= params.max_tokens) or \
                len(request.prompt) + k + 1 >= self.max_model_len:
            finish_reason = "length"
        request.num_generated = k + 1
        delta = RequestDelta(request.request_id, [token], finished=finish_reason is not None,
                             finish_reason=finish_reason, stop_reason=stop_reason, timestamp=now)
        if params.logprobs is not None:
            rank = 1 if params.greedy else request.rng.randint(1, 3)
            delta.logprobs = [self._logprobs(token, params.logprobs, rank)]
        if k == 0:
            delta.scheduled_time = request.arrival + 1e-4
            delta.num_cached_tokens = 0
            if params.prompt_logprobs is not None:
                delta.prompt_logprobs = [None] + [self._logprobs(t, params.prompt_logprobs, 1)
                                                  for t in request.prompt[1:]]
        return delta

    def _logprobs(self, token: int, k: int, rank: int) -> TokenLogprobs:
        """Made-up logprobs: `token` sits at `rank` in a fixed descending order of candidates."""
        vocab = self.config.vocab_size
        order = [(token + j) % vocab for j in range(1, k + 2)]
        order.insert(rank - 1, token)
        values = [-0.1 - 0.5 * i for i in range(len(order))]
        return TokenLogprobs(token_ids=[token] + order[:k], logprobs=[values[rank - 1]] + values[:k], rank=rank)


def _merge(first: RequestDelta, later: RequestDelta | EngineDeadError) -> RequestDelta | EngineDeadError:
    """Two consecutive steps' news as one delta (what a client does when its consumer lags)."""
    if isinstance(later, EngineDeadError):
        return later
    first.new_token_ids = first.new_token_ids + later.new_token_ids
    if later.logprobs:
        first.logprobs = (first.logprobs or []) + later.logprobs
    first.finished, first.finish_reason, first.stop_reason = later.finished, later.finish_reason, later.stop_reason
    first.timestamp = later.timestamp
    return first
