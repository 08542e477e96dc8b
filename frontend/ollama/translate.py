"""Ollama's chat and generate requests as chat requests: the input half of the /api layer over chat.

messages -> chat messages (a tool message's tool_name -> its name; an assistant's tool calls, whose
arguments are objects, -> OpenAI tool calls; `thinking` -> the earlier turn's reasoning); generate's
system and prompt -> a system and a user message; tools pass through (they are OpenAI's shape already);
`format` "json" -> a json_object response_format and a schema -> a json_schema one (structured outputs);
`think` -> the template's enable_thinking (and DeepSeek's and Granite's `thinking`, and reasoning_effort
for a level); options -> sampling fields (frontend/ollama/options.py). Images are refused with a 400 naming
them: the served models read text only.
"""

from __future__ import annotations

import orjson

from frontend.chat.protocol import ChatCompletionRequest, ChatMessage, JsonSchemaFormat, ResponseFormat
from frontend.errors import invalid
from frontend.ollama.options import FIELD_NAMES as OPTION_NAMES
from frontend.ollama.options import Options, sampling_fields
from frontend.ollama.protocol import OllamaChatRequest, OllamaGenerateRequest, OllamaMessage, OllamaSampledRequest

THINK_LEVELS = ("low", "medium", "high")
FIELD_NAMES = {**OPTION_NAMES, "response_format.json_schema.schema": "format", "response_format": "format"}


def chat_request(req: OllamaChatRequest, options: Options) -> ChatCompletionRequest:
    messages = [_chat_message(message, i) for i, message in enumerate(req.messages)]
    return _request(req, options, messages, tools=req.tools or None, tool_choice="auto" if req.tools else None)


def generate_request(req: OllamaGenerateRequest, options: Options) -> ChatCompletionRequest:
    """A non-raw generate: the prompt as a user turn under the model's chat template."""
    _no_images(req.images, "images")
    messages = [ChatMessage(role="system", content=req.system)] if req.system else []
    messages.append(ChatMessage(role="user", content=req.prompt))
    return _request(req, options, messages)


def sampling_request(req: OllamaSampledRequest, options: Options) -> ChatCompletionRequest:
    """A raw generate's sampling and format, in a chat request that has no use for its one message."""
    return _request(req, options, [ChatMessage(role="user", content="")])


def _request(req: OllamaSampledRequest, options: Options, messages: list[ChatMessage], **tools) -> ChatCompletionRequest:
    kwargs, include_reasoning = _think(req.think)
    return ChatCompletionRequest(messages=messages, stream=req.stream, response_format=_format(req.format),
                                 chat_template_kwargs=kwargs, include_reasoning=include_reasoning, **tools,
                                 **sampling_fields(options))


def _think(think: bool | str | None) -> tuple[dict | None, bool]:
    if think is None:
        return None, True
    if isinstance(think, str):
        if think not in THINK_LEVELS:
            raise invalid(f"think must be true, false or one of {', '.join(THINK_LEVELS)}; got {think[:32]!r}",
                          "think")
        return {"enable_thinking": True, "thinking": True, "reasoning_effort": think}, True
    return {"enable_thinking": think, "thinking": think}, think


def _format(fmt: str | dict | None) -> ResponseFormat | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat(type="json_object")
    if isinstance(fmt, str):
        raise invalid(f"format must be \"json\" or a JSON schema; got {fmt!r}", "format")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="format", schema=fmt))


def _chat_message(message: OllamaMessage, index: int) -> ChatMessage:
    _no_images(message.images, f"messages[{index}].images")
    tool_calls = None
    if message.tool_calls:
        tool_calls = [{"id": call.id or f"call_{index}_{j}", "type": "function",
                       "function": {"name": call.function.name,
                                    "arguments": orjson.dumps(call.function.arguments).decode()}}
                      for j, call in enumerate(message.tool_calls)]
    return ChatMessage(role=message.role, content=message.content, tool_calls=tool_calls,
                       name=message.tool_name if message.role == "tool" else None,
                       tool_call_id=message.tool_call_id, reasoning_content=message.thinking)


def _no_images(images: list[str] | None, param: str) -> None:
    if images:
        raise invalid("images are not supported: the served model reads text only", param)
