"""Ollama's request types (POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show, the
model-management routes) as msgspec Structs: decoding a body validates it, naming the field of a bad value.

`options` stays a plain object here: Ollama ignores options it does not know, and so does ringserve (logging
each unknown name once); the ones it acts on are checked by `Options` (frontend/ollama/options.py). Keys
that Ollama clients send but ringserve does not act on at the top level (shift, ...) are accepted and
ignored, as Ollama does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from frontend.chat.protocol import MAX_MESSAGES, ShortStr

MAX_IMAGES = 64
MAX_EMBED_INPUTS = 2048          # inputs of one /api/embed request (as many as /v1/embeddings takes)
ModelName = Annotated[str, Meta(max_length=256)]
# a duration ("5m", "1h30m", "-1s") or a number of seconds; checked by frontend/ollama/keep_alive.py
KeepAlive = Annotated[str, Meta(max_length=64)] | float | None
# "json", "" or a JSON schema
Format = Annotated[str, Meta(max_length=16)] | dict[str, Any] | None
# false, true, or an effort level ("low", "medium", "high") for models that take one
Think = bool | Annotated[str, Meta(max_length=16)] | None
Images = Annotated[list[str], Meta(max_length=MAX_IMAGES)] | None


class OllamaToolCallFunction(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    arguments: dict[str, Any] = {}
    index: int | None = None


class OllamaToolCall(msgspec.Struct, kw_only=True):
    function: OllamaToolCallFunction
    id: ShortStr | None = None


class OllamaMessage(msgspec.Struct, kw_only=True):
    role: Annotated[str, Meta(min_length=1, max_length=64)]
    content: str = ""
    thinking: str | None = None
    images: Images = None                     # refused: the models read text only
    tool_calls: Annotated[list[OllamaToolCall], Meta(max_length=1024)] | None = None
    tool_name: ShortStr | None = None         # a tool message: the tool that answered
    tool_call_id: ShortStr | None = None


class OllamaSampledRequest(msgspec.Struct, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: ModelName
    stream: bool = True
    format: Format = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None              # refused when true: not yet on this API
    top_logprobs: int | None = None


class OllamaChatRequest(OllamaSampledRequest, kw_only=True):
    messages: Annotated[list[OllamaMessage], Meta(max_length=MAX_MESSAGES)] = []
    tools: Annotated[list[dict[str, Any]], Meta(max_length=1024)] | None = None


class OllamaGenerateRequest(OllamaSampledRequest, kw_only=True):
    prompt: str = ""
    system: str | None = None
    suffix: str | None = None                 # refused: fill-in-the-middle is not served
    template: str | None = None               # refused: Go templates are not run
    raw: bool = False
    context: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=1 << 20)] | None = None
    images: Images = None


class OllamaEmbedRequest(msgspec.Struct, kw_only=True):
    """/api/embed: `truncate` (Ollama's default true) cuts an input to the model's maximum input length;
    false makes a too-long input a 400."""

    model: ModelName
    input: str | Annotated[list[str], Meta(max_length=MAX_EMBED_INPUTS)] = ""
    truncate: bool = True
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class OllamaEmbeddingsRequest(msgspec.Struct, kw_only=True):
    """/api/embeddings, the older route: one prompt, one vector."""

    model: ModelName
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class OllamaShowRequest(msgspec.Struct, kw_only=True):
    model: ModelName | None = None
    name: ModelName | None = None             # the older clients' field
    verbose: bool = False


class OllamaModelRequest(msgspec.Struct, kw_only=True):
    """/api/pull, /api/push, /api/delete, /api/create: answered with an error (see handlers), whatever the
    model (so its field is not `model`, which the handler base would check against the served one)."""

    model_name: ModelName | None = msgspec.field(default=None, name="model")
    name: ModelName | None = None
    stream: bool = True


class OllamaCopyRequest(msgspec.Struct, kw_only=True):
    source: ModelName
    destination: ModelName
