"""What every API handler shares: reading and checking a request, its sampling params and choices, and
the Run that takes them through the engine (frontend/runner.py), which each API writes in its own shape.

`OpenAIServing` (vLLM's name for the shared handler base) is the base of every API's handlers;
`ServingContext` is the state they share, built once by create_app.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request

from engine.client.base import AsyncEngine
from engine.client.detokenizer import Detokenizer, backend_tokenizer
from engine.errors import UnsupportedTaskError
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from frontend.chat.protocol import MAX_CHOICES, SamplingRequest
from frontend.chat.template import ChatTemplate
from frontend.choices import Choice
from frontend.config import ServerConfig
from frontend.errors import ApiError, from_validation_error, invalid
from frontend.metrics import ModelMetrics, RequestEventLog
from frontend.prompts import PromptPreparation
from frontend.runner import OutputParser, Run

T = TypeVar("T")
_FIELD = re.compile(r"[a-z_]+")


@dataclass(slots=True)
class ServingContext:
    """Everything the handlers share, built once by create_app."""

    engine: AsyncEngine
    config: ServerConfig
    tokenizer: object
    model_name: str
    max_model_len: int
    vocab_size: int
    max_logprobs: int
    generation_defaults: dict
    metrics: ModelMetrics
    events: RequestEventLog
    token_strings: Callable[[int], str]     # token id -> its text alone, cached (logprobs, /tokenize)
    chat_template: ChatTemplate | None
    max_prompt_chars: int | None = None     # a prompt longer than this is certain to exceed max_model_len
    chars_per_token: int | None = None      # the most characters one token covers (engine/client/token_bounds)
    local_paths: dict[str, str] | None = None   # local paths engine errors may name -> what clients see
    tokenizer_pool: ThreadPoolExecutor | None = None   # where long texts are tokenized, a few at a time
    model_names: tuple[str, ...] = ()       # every model the server serves (a 404 lists them)


class OpenAIServing(PromptPreparation):
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
        data = await request_body(request, self.ctx.config)
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
            served = ", ".join(f"`{name}`" for name in self.ctx.model_names or (self.ctx.model_name,))
            raise ApiError(404, f"The model `{model}` does not exist; this server serves {served}.", "model")

    def check_engine(self, pooling: bool = False) -> None:
        """Before a request's work: 400 when the model is of the other kind (generation asked of a pooling model,
        or embeddings of a generative one; the message says which kind it is), 503 when the engine is dead."""
        try:
            UnsupportedTaskError.check(self.ctx.model_name, self.engine.config.runner, pooling)
        except UnsupportedTaskError as e:
            raise invalid(str(e), "model") from None
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

    def run(self, request: Request, response_id: str, prompts: list[list[int]], params: list[SamplingParams],
            n: int, arrival: float, *, keep_output: bool, echo_texts: list[str] | None = None,
            parsers: list[OutputParser] | None = None, priority: int = 0, cache_salt: str | None = None,
            structured: str | None = None) -> Run:
        """The run of n choices per prompt (`parsers`: one per choice, to read its output), not yet started:
        `Run.respond` starts it. keep_output: the choices keep their whole output (for a whole response)."""
        choices = self.make_choices(response_id, prompts, params, n, arrival, keep_output, echo_texts)
        return Run(self.engine, response_id, choices, prompt_tokens=sum(map(len, prompts)), parsers=parsers,
                   priority=priority, cache_salt=cache_salt, data_parallel_rank=self.data_parallel_rank(request),
                   structured=structured, local_paths=self.ctx.local_paths)

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"


async def request_body(request: Request, config: ServerConfig) -> bytes:
    """The request's body, read once within the size limit and the read deadline (413, 408), then kept on the
    request: the model router reads it first to find the `model`, the handler decodes it."""
    data = getattr(request.state, "body", None)
    if data is not None:
        return data
    limit = config.max_request_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    try:
        data = await asyncio.wait_for(_read_body(request, limit), config.body_read_timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {config.body_read_timeout:g} s "
                            "(--body-read-timeout)") from None
    request.state.body = data
    return data


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
