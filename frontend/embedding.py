"""The one embedding service behind every API's pooling routes (OpenAI's /v1/embeddings, vLLM's /v1/score and
/v1/rerank, Ollama's /api/embed): inputs, as strings or token ids, turned into vectors through the engine,
within bounds, with errors that name the problem.

1. `prepare` checks the model is a pooling model (a generative one is a 400 that says so: the reverse check,
   generation on a pooling model, is OpenAIServing.check_engine's), reads the pooling params (a bad
   `dimensions` or `truncate_prompt_tokens` is a 400 naming it) and tokenizes as prompts are
   (frontend/prompts.py): a text certain to exceed max_model_len is refused untokenized, short texts are
   tokenized inline and long ones on the tokenizer pool. With truncate_prompt_tokens, inputs are cut on the
   tokenizer's truncation side exactly as the offline LLM.embed cuts them (engine/client/pooling.py); without
   it an input over max_model_len is a 400 naming max_model_len. Nothing reaches the engine before every input
   of the request has passed.
2. `vectors` sends every input to the engine at once (EngineClient.encode), so one engine step batches them;
   the first failure cancels the rest. `respond` runs that as the response: a client that leaves cancels it,
   which aborts the engine requests; an engine failure is an error response (503 for a dead engine).

How a route finds its engine is the handler's `engine` (the one accessor every route uses).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson
from starlette.requests import Request
from starlette.types import Send

from engine.client.detokenizer import backend_tokenizer
from engine.client.pooling import TRUNCATE_REMEDY, PoolingInput, resolve_pooling_params, too_long_message
from engine.client.scoring import embed
from engine.sampling_params import PoolingParams
from frontend.errors import ApiError, error_body_for, from_engine_error, invalid
from frontend.http_responses import JSON_HEADERS, DisconnectAwareResponse
from frontend.serving_engine import OpenAIServing

logger = logging.getLogger("ringserve.serving")
_INPUT_KINDS = "a string, a list of strings, a list of token ids, or a list of token-id lists"
_BODY = "http.response.body"


@dataclass(slots=True)
class PoolingJob:
    """One request's inputs, tokenized and checked, ready for the engine."""

    request_id: str
    prompts: list[list[int]]
    params: PoolingParams
    priority: int
    data_parallel_rank: int | None
    path: str                       # the route: errors take its API's shape
    arrival: float

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


def split_inputs(value, param: str, limit: int) -> list[PoolingInput]:
    """OpenAI's `input` (a string, a list of strings, token ids, a list of token-id lists) as a list of inputs;
    400 naming `param` for an empty input, mixed kinds, or more than `limit` inputs."""
    if isinstance(value, str):
        items = [value]
    elif not value:
        raise invalid(f"{param} must not be empty; it is {_INPUT_KINDS}", param)
    elif all(isinstance(item, int) for item in value):
        items = [value]
    elif all(isinstance(item, str) for item in value) or all(isinstance(item, list) for item in value):
        items = value
    else:
        raise invalid(f"{param} mixes kinds; it must be {_INPUT_KINDS}", param)
    if len(items) > limit:
        raise invalid(f"at most {limit} inputs per request, got {len(items)}", param)
    for i, item in enumerate(items):
        if not item:
            where = param if len(items) == 1 else f"{param}[{i}]"
            raise invalid(f"{where} is empty: it needs at least one character or token", param)
    return items


class EmbeddingService:
    """Held by a handler (an OpenAIServing: its ctx, engine, tokenizer and request reading) as ChatPreparation
    is; each API writes the vectors in its own shape."""

    def __init__(self, serving: OpenAIServing):
        self.serving = serving
        self.ctx = serving.ctx

    # ------------------------------------------------------------------ before the engine
    def check_model(self) -> None:
        """400 unless the model serves embeddings (the message says which kind it is); 503 when the engine is dead."""
        self.serving.check_engine(pooling=True)

    def pooling_params(self, *, dimensions: int | None = None, normalize: bool | None = None,
                       truncate_prompt_tokens: int | None = None) -> PoolingParams:
        """The request's PoolingParams, resolved against the model: 400 naming the field it cannot honour
        (`dimensions` on a model without Matryoshka representations, a truncate_prompt_tokens past max_model_len)."""
        try:
            params = PoolingParams(truncate_prompt_tokens=truncate_prompt_tokens, dimensions=dimensions,
                                   normalize=normalize)
        except ValueError as e:
            raise invalid(str(e), str(e).split(" ", 1)[0]) from None
        try:
            params = resolve_pooling_params(params, self.serving.engine.config)
        except ValueError as e:
            raise invalid(str(e), "dimensions") from None
        limit = self.ctx.max_model_len
        if truncate_prompt_tokens is not None and truncate_prompt_tokens > limit:
            raise invalid(f"truncate_prompt_tokens ({truncate_prompt_tokens}) is greater than this model's maximum "
                          f"input length, max_model_len ({limit})", "truncate_prompt_tokens")
        return params

    async def prepare(self, request: Request, fields: dict[str, list[PoolingInput]], params: PoolingParams, *,
                      priority: int = 0, add_special_tokens: bool = True, prefix: str = "embd",
                      remedy: str = TRUNCATE_REMEDY) -> PoolingJob:
        """A job of every field's inputs (request field name -> its inputs; errors name the field), tokenized
        and checked, in the order given (call check_model and pooling_params first). `remedy`: how this API
        asks for truncation, said when an input is too long."""
        serving = self.serving
        prompts = []
        for param, inputs in fields.items():
            prompts += await self.tokenize(inputs, params.truncate_prompt_tokens, param, add_special_tokens, remedy)
        return PoolingJob(serving.new_id(prefix), prompts, params, priority, serving.data_parallel_rank(request),
                          request.scope["path"], time.monotonic())

    async def tokenize(self, inputs: list[PoolingInput], truncate_prompt_tokens: int | None, param: str,
                       add_special_tokens: bool = True, remedy: str = TRUNCATE_REMEDY) -> list[list[int]]:
        """Token ids of each input, in order, each within max_model_len (cut to truncate_prompt_tokens when it
        is given, else a 400 naming max_model_len)."""
        serving, limit = self.serving, self.ctx.max_model_len
        for ids in inputs:
            if not isinstance(ids, str):
                serving.check_token_ids(ids, param)
        if truncate_prompt_tokens is not None:
            # rare, and cut as LLM.embed cuts (the tokenizer's own truncation): on the pool, off the event loop
            length = limit if truncate_prompt_tokens == -1 else truncate_prompt_tokens
            side = getattr(self.ctx.tokenizer, "truncation_side", "right")
            return await asyncio.get_running_loop().run_in_executor(
                self.ctx.tokenizer_pool, _tokenize_truncated, backend_tokenizer(self.ctx.tokenizer), side, inputs,
                length, add_special_tokens)
        texts = [item for item in inputs if isinstance(item, str)]
        encoded = iter(await serving.tokenize_prompts(texts, add_special_tokens, param) if texts else ())
        prompts = [next(encoded) if isinstance(item, str) else item for item in inputs]
        for i, ids in enumerate(prompts):
            if len(ids) > limit:
                where = "" if len(prompts) == 1 else f"{param}[{i}]: "
                raise invalid(where + too_long_message(len(ids), limit, remedy), param)
            if not ids:
                raise invalid(f"{param}[{i}] has no tokens", param)
        return prompts

    # ------------------------------------------------------------------ through the engine
    async def vectors(self, job: PoolingJob) -> list[np.ndarray]:
        """Each prompt's vector (float32, as the params ask), in order; ApiError when the engine fails it."""
        try:
            vectors = await embed(self.serving.engine, job.prompts, job.params, job.request_id,
                                  priority=job.priority, data_parallel_rank=job.data_parallel_rank)
        except ApiError:
            raise
        except Exception as e:
            error = from_engine_error(e, self.ctx.local_paths)
            if error.status == 500:
                logger.error("request %s failed: %s: %s", job.request_id, type(e).__name__, e, exc_info=e)
            raise error from None
        # The series of the engine asked for (a pooling result does not say which data-parallel engine served it).
        metrics = self.ctx.metrics.engine(job.data_parallel_rank or 0)
        metrics.prompt_tokens += job.prompt_tokens
        metrics.e2e_request_latency.observe(time.monotonic() - job.arrival)
        return vectors

    def respond(self, job: PoolingJob, body: Callable[[list[np.ndarray]], dict],
                error_body: Callable[[ApiError], dict] | None = None) -> DisconnectAwareResponse:
        """The response: `body(vectors)` as JSON (numpy arrays written as lists), or the failure in the route's
        API shape (`error_body`: another API's own); the engine requests are aborted if the client leaves."""
        async def produce(send: Send) -> None:
            try:
                status, headers = 200, JSON_HEADERS
                content = orjson.dumps(body(await self.vectors(job)), option=orjson.OPT_SERIALIZE_NUMPY)
            except ApiError as error:
                status, headers = error.status, error.headers
                content = orjson.dumps(error_body(error) if error_body else
                                       error_body_for(job.path, error.status, error.message, error.param))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": _BODY, "body": content, "more_body": False})

        return DisconnectAwareResponse(produce)


def _tokenize_truncated(backend, side: str, inputs: list[PoolingInput], length: int,
                        add_special_tokens: bool) -> list[list[int]]:
    """Inputs cut to `length` tokens on the tokenizer's truncation side, as transformers cuts them (the text's
    tokens first, so that the special tokens stay), without touching the shared tokenizer's settings."""
    keep = max(length - (backend.num_special_tokens_to_add(False) if add_special_tokens else 0), 0)
    encodings = iter(backend.encode_batch([item for item in inputs if isinstance(item, str)],
                                          add_special_tokens=False))
    prompts = []
    for item in inputs:
        if isinstance(item, str):
            encoding = next(encodings)
            encoding.truncate(keep, direction=side)
            prompts.append((backend.post_process(encoding) if add_special_tokens else encoding).ids)
        elif len(item) > length:
            prompts.append(item[-length:] if side == "left" else item[:length])
        else:
            prompts.append(item)
    return prompts
