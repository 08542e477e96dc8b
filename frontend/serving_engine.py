"""What the completions and chat handlers share: reading and checking a request, building sampling params
and choices, and running the response (SSE stream or one JSON body) against the engine.

Subclasses say how their chunks and bodies look (`_chunk`, `_response_body`, `_prelude`); the streaming
loop here is the per-token hot path: a text-only step costs one prebuilt-bytes join and one `send`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

import msgspec
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.types import Send

from engine.client.detokenizer import Detokenizer, backend_tokenizer
from engine.outputs import RequestDelta
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from frontend.chat.template import ChatTemplate
from frontend.choices import Choice, ChoiceEvent, merge_streams, stream_choice
from frontend.config import ServerConfig
from frontend.errors import ApiError, error_body, from_engine_error, from_validation_error, invalid
from frontend.openai.logprobs import TokenStrings
from frontend.metrics import ServerMetrics
from frontend.profiling import RequestEventLog
from frontend.prompts import PromptPreparation
from frontend.chat.protocol import MAX_CHOICES, SamplingRequest
from frontend.http_responses import JSON_HEADERS, SSE_DONE, SSE_HEADERS, DisconnectAwareResponse, sse_event

logger = logging.getLogger("ringserve.serving")

T = TypeVar("T")
_FIELD = re.compile(r"[a-z_]+")
_TEXT_PROBE = "\x00"                       # stands in for a chunk's text to split it into prebuilt parts
_TEXT_PROBE_JSON = orjson.dumps(_TEXT_PROBE)


@dataclass(slots=True)
class ServingContext:
    """Everything the handlers share, built once by create_app."""

    engine: object
    config: ServerConfig
    tokenizer: object
    model_name: str
    max_model_len: int
    vocab_size: int
    max_logprobs: int
    generation_defaults: dict
    metrics: ServerMetrics
    events: RequestEventLog
    token_strings: TokenStrings
    chat_template: ChatTemplate | None
    max_prompt_chars: int | None = None     # a prompt longer than this is certain to exceed max_model_len
    chars_per_token: int | None = None      # the most characters one token covers (engine/client/token_bounds)
    local_paths: dict[str, str] | None = None   # local paths engine errors may name -> what clients see
    tokenizer_pool: ThreadPoolExecutor | None = None   # where long texts are tokenized, a few at a time


@dataclass(slots=True)
class GenerationJob:
    """One API request on its way through the engine."""

    response_id: str
    created: int
    choices: list[Choice]
    prompt_tokens: int                      # usage: each prompt counted once, whatever n is
    stream: bool
    include_usage: bool
    logprobs: int | None                    # per-token logprobs asked for (None: not asked)
    priority: int = 0
    cache_salt: str | None = None
    echo: bool = False
    prompt_logprobs: bool = False           # vLLM's prompt_logprobs asked for (shown in the response)
    data_parallel_rank: int | None = None   # X-data-parallel-rank: the engine this request is pinned to
    structured: str | None = None           # the field of its grammar constraint, if any: a stream then
                                            # holds its headers for the first event, so that a grammar the
                                            # engine fails on (a compile past its deadline) is still a 400
    output_parsers: list | None = None      # chat: per choice, reasoning and tool-call parsing (chat_output)
    chat_output: object = None              # chat: the ChatOutputOptions those parsers share


class OpenAIServing(PromptPreparation):
    object_name = ""                        # "text_completion", "chat.completion.chunk", ...

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx
        self.engine = ctx.engine
        backend = backend_tokenizer(ctx.tokenizer)
        self._encode = backend.encode
        self._encode_batch = backend.encode_batch
        self._decode = backend.decode

    # ------------------------------------------------------------------ reading and checking requests
    async def read(self, request: Request, kind: type[T]) -> T:
        """The body decoded as `kind`: 413 past the size limit, 400 naming the field on a bad value."""
        limit = self.ctx.config.max_request_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        timeout = self.ctx.config.body_read_timeout
        try:
            data = await asyncio.wait_for(_read_body(request, limit), timeout)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {timeout:g} s "
                                "(--body-read-timeout)") from None
        try:
            body = msgspec.json.decode(data, type=kind)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise from_validation_error(e) from None
        except UnicodeDecodeError as e:
            raise invalid(f"request body is not valid UTF-8: {e.reason} at byte {e.start} of a string") from None
        except RecursionError:
            raise invalid("request body is nested too deeply") from None
        self.check_model(getattr(body, "model", None))
        return body

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.ctx.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                                f"`{self.ctx.model_name}`.", "model")

    def check_engine(self) -> None:
        if self.engine.is_dead:
            raise ApiError(503, f"the engine is not running: {self.engine.dead_error}")

    def data_parallel_rank(self, request: Request) -> int | None:
        """The X-data-parallel-rank header (vLLM's): pin the request to that engine; 400 if no such rank."""
        value = request.headers.get("x-data-parallel-rank")
        if value is None:
            return None
        size = self.ctx.engine.config.data_parallel_size
        if not value.strip().isdigit() or int(value) >= size:
            raise ApiError(400, f"X-data-parallel-rank must be an engine rank from 0 to {size - 1}, "
                                f"got {value!r}", "X-data-parallel-rank")
        return int(value)

    def engine_error(self, error: Exception) -> ApiError:
        """What the engine raised for one request, as the API error it is (local paths hidden)."""
        return from_engine_error(error, self.ctx.local_paths)

    def sampling_params(self, req: SamplingRequest, *, logprobs: int | None, prompt_logprobs: int | None,
                        names: dict[str, str],
                        structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
        """The request's SamplingParams (n kept, max_tokens set per prompt later), resolved and checked.

        `names` maps SamplingParams fields to this endpoint's request fields, for error messages.
        """
        logit_bias = None
        if req.logit_bias is not None:
            try:
                logit_bias = {int(token): bias for token, bias in req.logit_bias.items()}
            except ValueError:
                raise invalid("logit_bias keys must be token ids (integers as strings)", "logit_bias") from None
        try:
            params = SamplingParams(
                n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                seed=req.seed, presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty, stop=req.stop or [],
                stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos, max_tokens=None,
                min_tokens=req.min_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                logit_bias=logit_bias, allowed_token_ids=req.allowed_token_ids,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                structured_outputs=structured_outputs,
            ).resolved(self.ctx.generation_defaults)
            params.validate_against(vocab_size=self.ctx.vocab_size, max_logprobs=self.ctx.max_logprobs)
        except ValueError as e:
            field = _FIELD.match(str(e))
            name = field.group(0) if field else None
            raise invalid(str(e), names.get(name, name)) from None
        return params

    def prompt_params(self, params: SamplingParams, prompt_len: int, max_tokens: int | None,
                      max_tokens_param: str, prompt_param: str) -> SamplingParams:
        """Params for one prompt: max_tokens defaults to what the context has left (at most the default
        sampling's max_tokens, when a generation config sets max_new_tokens), as in vLLM."""
        limit = self.ctx.max_model_len
        if prompt_len == 0:
            raise invalid("the prompt is empty", prompt_param)
        if prompt_len >= limit:
            raise invalid(f"This model's maximum context length is {limit} tokens, and the prompt has "
                          f"{prompt_len} tokens, which leaves no room for output.", prompt_param)
        if max_tokens is None:
            max_tokens = min(limit - prompt_len, self.ctx.generation_defaults.get("max_tokens", limit))
        elif prompt_len + max_tokens > limit:
            raise invalid(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for "
                          f"the completion). Please reduce the prompt or max_tokens.", max_tokens_param)
        if params.min_tokens > max_tokens:
            raise invalid(f"min_tokens ({params.min_tokens}) must be at most max_tokens ({max_tokens})",
                          "min_tokens")
        return msgspec.structs.replace(params, max_tokens=max_tokens)

    def make_choices(self, prefix: str, prompts: list[list[int]], params: list[SamplingParams], n: int,
                     arrival: float, keep_output: bool, echo_texts: list[str] | None = None) -> list[Choice]:
        """n choices per prompt, indexed prompt-major; child i of a prompt gets params.child(i)."""
        if len(prompts) * n > MAX_CHOICES:
            raise invalid(f"{len(prompts)} prompts x n={n} makes more than {MAX_CHOICES} choices", "n")
        ctx = self.ctx
        choices = []
        for p, (ids, prompt_params) in enumerate(zip(prompts, params, strict=True)):
            for i in range(n):
                child = prompt_params.child(i)
                index = p * n + i
                choices.append(Choice(
                    index, f"{prefix}-{index}", ids, child, Detokenizer(ctx.tokenizer, child, ids), arrival,
                    ctx.metrics, ctx.events, keep_output=keep_output,
                    echo_text=echo_texts[p] if echo_texts else "",
                ))
        return choices

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    # ------------------------------------------------------------------ running the response
    def respond(self, job: GenerationJob) -> DisconnectAwareResponse:
        if job.stream:
            for choice in job.choices:
                head, _, tail = sse_event(self._chunk(job, choice, _TEXT_PROBE, None)).partition(_TEXT_PROBE_JSON)
                choice.chunk_head, choice.chunk_tail = head, tail
            return DisconnectAwareResponse(lambda send: self._stream(job, send))
        return DisconnectAwareResponse(lambda send: self._complete(job, send))

    def _events(self, job: GenerationJob) -> AsyncIterator[ChoiceEvent]:
        streams = [stream_choice(self.engine, choice, priority=job.priority, cache_salt=job.cache_salt,
                                 data_parallel_rank=job.data_parallel_rank)
                   for choice in job.choices]
        return streams[0] if len(streams) == 1 else merge_streams(streams)

    async def _stream(self, job: GenerationJob, send: Send) -> None:
        async with aclosing(self._events(job)) as events:
            first = None
            if job.structured:
                try:
                    first = await events.__anext__()
                except StopAsyncIteration:
                    pass
                except Exception as e:  # nothing was sent yet: answer with the error's own status
                    await self._send_error(send, e, job)
                    return
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await self._stream_events(job, send, events, first)

    async def _stream_events(self, job: GenerationJob, send: Send, events: AsyncIterator[ChoiceEvent],
                             first: ChoiceEvent | None) -> None:
        body = "http.response.body"
        try:
            for chunk in self._prelude(job):
                await send({"type": body, "body": chunk, "more_body": True})
            with_logprobs = job.logprobs is not None
            parsed = job.output_parsers is not None
            async for choice, text, delta in (events if first is None else _prepend(first, events)):
                if parsed:
                    for chunk in self._parsed_chunks(job, choice, text, delta):
                        await send({"type": body, "body": chunk, "more_body": True})
                    continue
                if choice.finish_reason is None and not with_logprobs:
                    if not text:
                        continue
                    chunk = choice.chunk_head + orjson.dumps(text) + choice.chunk_tail
                else:
                    chunk = sse_event(self._chunk(job, choice, text, delta))
                await send({"type": body, "body": chunk, "more_body": True})
            if job.include_usage:
                await send({"type": body, "body": sse_event(self._usage_chunk(job)), "more_body": True})
        except Exception as e:  # the stream has started: report in-band, then end it properly
            error = self.engine_error(e)
            if error.status == 500:
                logger.exception("request %s failed mid-stream", job.response_id)
            await send({"type": body, "body": sse_event(error_body(error.status, error.message)),
                        "more_body": True})
        await send({"type": body, "body": SSE_DONE, "more_body": False})

    async def _send_error(self, send: Send, e: Exception, job: GenerationJob) -> None:
        error = _with_param(self.engine_error(e), job)
        if error.status == 500:
            logger.exception("request %s failed", job.response_id)
        await send({"type": "http.response.start", "status": error.status, "headers": error.headers})
        await send({"type": "http.response.body", "body": orjson.dumps(error_body(error.status, error.message,
                                                                                  error.param)),
                    "more_body": False})

    async def _complete(self, job: GenerationJob, send: Send) -> None:
        try:
            async with aclosing(self._events(job)) as events:
                async for _ in events:
                    pass
            status, headers, body = 200, JSON_HEADERS, self._response_body(job)
        except Exception as e:
            error = _with_param(self.engine_error(e), job)
            if error.status == 500:
                logger.exception("request %s failed", job.response_id)
            status, headers = error.status, error.headers
            body = error_body(error.status, error.message, error.param)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": orjson.dumps(body), "more_body": False})

    def usage(self, job: GenerationJob) -> dict:
        completion = sum(choice.num_output_tokens for choice in job.choices)
        return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion,
                "total_tokens": job.prompt_tokens + completion}

    def _usage_chunk(self, job: GenerationJob) -> dict:
        return {"id": job.response_id, "object": self.object_name, "created": job.created,
                "model": self.ctx.model_name, "choices": [], "usage": self.usage(job)}

    def chunk_for(self, job: GenerationJob, item: dict) -> dict:
        """A stream chunk carrying one choice's item (with "usage": null when usage comes at the end)."""
        chunk = {"id": job.response_id, "object": self.object_name, "created": job.created,
                 "model": self.ctx.model_name, "choices": [item]}
        if job.include_usage:
            chunk["usage"] = None
        return chunk

    def body_for(self, job: GenerationJob, object_name: str, choices: list[dict]) -> dict:
        """A whole (non-streaming) response."""
        return {"id": job.response_id, "object": object_name, "created": job.created,
                "model": self.ctx.model_name, "choices": choices, "usage": self.usage(job)}

    # ------------------------------------------------------------------ endpoint-specific shapes
    def _prelude(self, job: GenerationJob) -> list[bytes]:
        """SSE chunks sent before any token (chat: the assistant role of each choice)."""
        return []

    def _chunk(self, job: GenerationJob, choice: Choice, text: str, delta: RequestDelta | None) -> dict:
        """A stream chunk for one choice's step; delta None builds the template of a plain text chunk."""
        raise NotImplementedError

    def _response_body(self, job: GenerationJob) -> dict:
        raise NotImplementedError

    def _parsed_chunks(self, job: GenerationJob, choice: Choice, text: str, delta: RequestDelta) -> list[bytes]:
        """SSE chunks of one step when the output is parsed (chat with tools or reasoning)."""
        raise NotImplementedError



async def _read_body(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected while sending the request") from None
    return b"".join(chunks)


async def _prepend(first: ChoiceEvent, events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[ChoiceEvent]:
    yield first
    async for event in events:
        yield event


def _with_param(error: ApiError, job: GenerationJob) -> ApiError:
    """An engine-side failure of a structured request (its grammar) names the constraint's field."""
    if error.status == 400 and error.param is None and job.structured is not None:
        error.param = job.structured
    return error
