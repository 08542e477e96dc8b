"""What the engine hands back to its callers (the server's handlers and the offline `LLM`).

`RequestDelta` is one engine step's news for one request, as the async `EngineClient.generate` yields it.
`RequestOutput` / `CompletionOutput` are the offline API's results, with vLLM's names; so are the pooling
models' results: `PoolingRequestOutput` (what `EngineClient.encode` yields: the vector as a float32 numpy
array), `EmbeddingRequestOutput` (`LLM.embed`: a list of floats) and `ScoringRequestOutput` (`LLM.score`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.errors import EngineDeadError

if TYPE_CHECKING:
    import numpy as np

# Why a request ended, as the APIs spell it; the wire carries the index into this tuple (engine.messages).
FINISH_REASONS = ("stop", "length", "abort", "error")   # "error": the request alone failed (e.g. its
                                                        # grammar did not compile); RequestDelta.error says why

__all__ = ["FINISH_REASONS", "CompletionOutput", "EmbeddingOutput", "EmbeddingRequestOutput", "EngineDeadError",
           "PoolingOutput", "PoolingRequestOutput", "RequestDelta", "RequestOutput", "ScoringOutput",
           "ScoringRequestOutput", "TokenLogprobs"]


@dataclass(slots=True)
class TokenLogprobs:
    """Logprobs at one position: column 0 is the chosen (sampled or prompt) token, then the top-k."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int                                   # rank of the chosen token, 1 = most likely


@dataclass(slots=True)
class RequestDelta:
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None            # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None        # the stop token id (or stop string) that ended it
    logprobs: list[TokenLogprobs] | None = None # one per new token, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprobs | None] | None = None   # prompt positions covered by this step
    num_cached_tokens: int | None = None        # prefix-cache hits, in the delta after first scheduling
    scheduled_time: float | None = None         # time.monotonic() of first scheduling
    timestamp: float = 0.0                      # time.monotonic() of the engine step
    error: str | None = None                    # with finish_reason "error": what went wrong, for the user
    pooled: np.ndarray | None = None            # a pooling request's vector (float32), in its finishing delta
    engine: int = 0                             # the data-parallel engine that ran it (metrics' `engine`)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    num_cached_tokens: int = 0
    finished: bool = False


@dataclass(slots=True)
class PoolingOutput:
    data: np.ndarray                            # float32 [dimensions]: pooled, then truncated and normalized
                                                # as the request's PoolingParams say


@dataclass(slots=True)
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass(slots=True)
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(output.request_id, EmbeddingOutput(output.outputs.data.tolist()), output.prompt_token_ids,
                   output.finished)


@dataclass(slots=True)
class ScoringOutput:
    score: float


@dataclass(slots=True)
class ScoringRequestOutput:
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]                 # the pair's token ids, first text's then second's
    finished: bool = True
