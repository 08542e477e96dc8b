"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a layer over chat.

The request is translated into a chat request (anthropic/translate.py), prepared by the one chat
preparation and run by the runner; this module writes the run's steps as content blocks. One `_Blocks`
assembler serves both the streaming and the whole response, so the two agree by construction: a stream is
the assembler's SSE frames (every frame with its `event:` line, which the anthropic SDK dispatches on), a
whole response is the content it assembled.
"""

from __future__ import annotations

import time
import uuid

import orjson
from starlette.requests import Request
from starlette.responses import Response

from frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from frontend.anthropic.translate import FIELD_NAMES, to_chat_request
from frontend.chat.output import CONTENT, REASONING, TOOL_CALL, turn_events
from frontend.chat.preparation import ChatPreparation
from frontend.chat.protocol import JsonSchemaFormat, ResponseFormat
from frontend.errors import ApiError, anthropic_error_body
from frontend.http_responses import SSE_HEADERS, DisconnectAwareResponse, json_response, sse
from frontend.runner import Run, Step
from frontend.serving_engine import OpenAIServing, ServingContext


class AnthropicServingMessages(OpenAIServing):
    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.chat = ChatPreparation(self)

    async def create_message(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, MessagesRequest)
        self.check_engine()
        response_format = None
        if req.output_config is not None and req.output_config.format is not None:
            response_format = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
                name="output", schema=req.output_config.format.schema, strict=True))
        chat = to_chat_request(req, max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                               top_k=req.top_k, seed=req.seed, stop=req.stop_sequences, stream=req.stream,
                               response_format=response_format)
        message_id = f"msg_{uuid.uuid4().hex}"
        prepared = await self.chat.prepare(chat, names=FIELD_NAMES, prompt_param="messages")
        run = self.run(request, message_id, [prepared.prompt], [prepared.params], 1, arrival, keep_output=False,
                       parsers=prepared.parsers(1), structured=prepared.structured)
        return run.respond(MessagesWire(run, self.ctx.model_name), req.stream)

    async def count_tokens(self, request: Request) -> Response:
        req = await self.read(request, CountTokensRequest)
        return json_response({"input_tokens": await self.chat.count_prompt_tokens(to_chat_request(req))})


class MessagesWire:
    """A run as an Anthropic message: content blocks, stop reason and usage."""

    stream_headers = SSE_HEADERS

    def __init__(self, run: Run, model: str):
        self.run = run
        self.model = model
        self.blocks = _Blocks()

    def head(self) -> bytes:
        start = {"type": "message_start", "message": self._message([], final=False)}
        return sse(start, "message_start") + sse({"type": "ping"}, "ping")

    def frames(self, step: Step) -> bytes:
        return b"".join([self.blocks.add(kind, text) for kind, text in turn_events(step.text, step.parts)])

    def take(self, step: Step) -> None:
        for kind, text in turn_events(step.text, step.parts):
            self.blocks.add(kind, text)

    def tail(self) -> bytes:
        end = self._message(self.blocks.content, final=True)
        delta = {"type": "message_delta", "delta": {"stop_reason": end["stop_reason"],
                                                    "stop_sequence": end["stop_sequence"]}, "usage": end["usage"]}
        return self.blocks.close() + sse(delta, "message_delta") + sse({"type": "message_stop"}, "message_stop")

    def body(self) -> dict:
        self.blocks.close()
        return self._message(self.blocks.content, final=True)

    def error_frames(self, error: ApiError) -> bytes:
        return sse(self.error_body(error), "error")

    def error_body(self, error: ApiError) -> dict:
        return anthropic_error_body(error.status, error.message, error.param)

    def _message(self, content: list[dict], *, final: bool) -> dict:
        run = self.run
        stop_reason = stop_sequence = None
        if final:
            stop_reason, stop_sequence = _stop_reason(run.choices[0], content)
        return {
            "id": run.request_id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": run.prompt_tokens, "output_tokens": run.output_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": run.cached_tokens},
        }


def _stop_reason(choice, content: list[dict]) -> tuple[str, str | None]:
    if choice.finish_reason == "length":
        return "max_tokens", None
    if isinstance(choice.stop_reason, str):          # the stop string that ended it
        return "stop_sequence", choice.stop_reason
    if any(block["type"] == "tool_use" for block in content):
        return "tool_use", None
    return "end_turn", None


class _Blocks:
    """Turn events (chat/output.turn_events) -> content blocks, and the stream frames that build them
    (content_block_start/delta/stop)."""

    def __init__(self):
        self.content: list[dict] = []
        self._open: str | None = None            # the kind of event the open block takes
        self._arguments = ""                      # the open tool_use block's JSON so far

    def add(self, kind: str, text: str) -> bytes:
        frames = b""
        if kind == TOOL_CALL or kind != self._open and kind in (CONTENT, REASONING):
            frames += self._end_open()
            frames += self._start(kind, text)
        index = len(self.content) - 1
        block = self.content[index]
        if kind == CONTENT:
            block["text"] += text
            delta = {"type": "text_delta", "text": text}
        elif kind == REASONING:
            block["thinking"] += text
            delta = {"type": "thinking_delta", "thinking": text}
        elif kind == TOOL_CALL:
            return frames
        else:
            self._arguments += text
            delta = {"type": "input_json_delta", "partial_json": text}
        return frames + sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")

    def _start(self, kind: str, text: str) -> bytes:
        if kind == CONTENT:
            block = {"type": "text", "text": ""}
        elif kind == REASONING:
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": text, "input": {}}
        self._open = kind if kind != TOOL_CALL else "tool_args"
        self.content.append(block)
        start = {"type": "content_block_start", "index": len(self.content) - 1, "content_block": dict(block)}
        return sse(start, "content_block_start")

    def close(self) -> bytes:
        """End the message's blocks (a message with no block at all gets one empty text block)."""
        frames = b"" if self.content else self._start(CONTENT, "")
        return frames + self._end_open()

    def _end_open(self) -> bytes:
        if self._open is None:
            return b""
        block = self.content[-1]
        if block["type"] == "tool_use":
            block["input"] = _tool_input(self._arguments)
            self._arguments = ""
        self._open = None
        return sse({"type": "content_block_stop", "index": len(self.content) - 1}, "content_block_stop")


def _tool_input(arguments: str) -> dict:
    """The call's arguments as an object; arguments cut short (max_tokens) or malformed give {}."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
