"""A request as the scheduler sees it: its tokens, its progress through the KV cache, its status.

One `Request` lives in the scheduler process from `AddRequest` until it finishes. Its token list only
grows (prompt, then one sampled token a step), `num_computed_tokens` counts the tokens whose keys and
values are in the KV cache, and the KV cache manager keeps the request's block table and block hashes on
it. The object is slotted and holds no per-token objects beyond the ints of its token list.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from engine.messages import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    TOKEN,
    AddRequest,
    unpack,
)
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.core.block_pool import KVCacheBlock
    from engine.core.structured_output import RequestGrammar


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2           # blocks freed; waits to be recomputed from its prompt and outputs
    FINISHED_STOPPED = 3    # EOS or a stop token
    FINISHED_LENGTH = 4     # max_tokens or max_model_len
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6      # this request alone failed (its grammar did not compile, or refused a token)


FINISH_CODES = {
    RequestStatus.FINISHED_STOPPED: FINISH_STOP,
    RequestStatus.FINISHED_LENGTH: FINISH_LENGTH,
    RequestStatus.FINISHED_ABORTED: FINISH_ABORT,
    RequestStatus.FINISHED_ERROR: FINISH_ERROR,
}


class Request:
    __slots__ = (
        "req", "params", "eos_token_ids", "prompt_token_bytes", "num_prompt_tokens", "all_token_ids",
        "num_computed_tokens", "status", "stop_reason", "arrival_time", "priority", "cache_salt",
        "stop_token_set", "min_tokens", "max_num_tokens", "skip_prefix_cache", "wire_bytes",
        "blocks", "block_hashes", "num_cached_blocks", "num_cached_tokens", "num_preemptions",
        "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts", "num_in_flight", "grammar",
        "spec_token_ids",
    )

    def __init__(
        self,
        req: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: list[int],
        *,
        max_model_len: int,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        prompt_token_bytes: bytes | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {req}: the prompt is empty; at least one token is needed")
        if len(prompt_token_ids) + 1 > max_model_len:
            raise ValueError(
                f"request {req}: the prompt has {len(prompt_token_ids)} tokens, so prompt plus one "
                f"generated token exceeds max_model_len ({max_model_len})"
            )
        self.req = req
        self.params = params
        self.eos_token_ids = eos_token_ids
        # The AddRequest's raw bytes, reused whenever the executors must be sent the prompt.
        self.prompt_token_bytes = prompt_token_bytes
        self.num_prompt_tokens = len(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Samples scheduled but not yet applied: 0 or 1 between steps, up to 2 under async scheduling.
        self.num_in_flight = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        now = time.monotonic()
        self.arrival_time = now if arrival_time is None else arrival_time
        self.priority = priority
        self.cache_salt = cache_salt

        # Stop conditions, resolved once so that the per-token check is a set lookup and two compares.
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(eos_token_ids)
        self.stop_token_set = frozenset(stops)
        self.min_tokens = params.min_tokens
        limit = max_model_len if params.max_tokens is None else self.num_prompt_tokens + params.max_tokens
        self.max_num_tokens = min(limit, max_model_len)
        # Prompt logprobs need logits at every prompt position, so nothing may be skipped by a cache hit.
        self.skip_prefix_cache = params.prompt_logprobs is not None
        # Upper bound of its NewRequestData's encoded size, set by the scheduler (which caps a step's sum).
        self.wire_bytes = 0

        # Owned by the KV cache manager: the block table and the hashes of the full blocks of tokens.
        self.blocks: list[KVCacheBlock] = []
        self.block_hashes: list[bytes] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens = 0          # prefix-cache hit at first scheduling
        self.num_preemptions = 0

        self.queued_ts = now
        self.scheduled_ts: float | None = None
        self.first_token_ts: float | None = None
        self.last_token_ts: float | None = None
        # Structured outputs: the compile, then the matcher (engine/core/structured_output.py).
        self.grammar: RequestGrammar | None = None
        # Speculative decoding: the draft tokens its scheduled step verifies (engine/core/speculator.py).
        self.spec_token_ids: list[int] | tuple[()] = ()

    @classmethod
    def from_add_request(cls, msg: AddRequest, max_model_len: int) -> Request:
        if msg.params.n != 1:
            raise ValueError(f"request {msg.req}: the scheduler takes n == 1 (got n={msg.params.n}); "
                             "the frontend fans out n > 1 into separate requests")
        return cls(
            msg.req,
            unpack(msg.prompt_token_ids, TOKEN).tolist(),
            msg.params,
            msg.eos_token_ids,
            max_model_len=max_model_len,
            arrival_time=msg.arrival_time,
            priority=msg.priority,
            cache_salt=msg.cache_salt,
            prompt_token_bytes=msg.prompt_token_ids,
        )

    # ------------------------------------------------------------------ derived values
    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    # ------------------------------------------------------------------ stop checks
    def append_token(self, token_id: int) -> RequestStatus | None:
        """Record one sampled token; return the finished status it causes, or None.

        EOS (unless ignore_eos) and stop_token_ids end the request only once min_tokens were produced;
        max_tokens and max_model_len end it with "length". A stop token on the last allowed position
        reports "stop", the more specific reason.
        """
        tokens = self.all_token_ids
        tokens.append(token_id)
        num_tokens = len(tokens)
        if token_id in self.stop_token_set and num_tokens - self.num_prompt_tokens >= self.min_tokens:
            # EOS reports no stop_reason (vLLM's convention); an explicit stop token names itself.
            self.stop_reason = token_id if token_id in self.params.stop_token_ids else None
            return RequestStatus.FINISHED_STOPPED
        if num_tokens >= self.max_num_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (f"Request({self.req}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.blocks)})")
