"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API as a layer over chat.

The request is translated into a chat request (anthropic_translate), run as one chat Turn, and the turn's
events become content blocks. One `_Blocks` assembler serves both the streaming and the whole response, so
the two agree by construction: a stream is the assembler's SSE frames (every frame with its `event:` line,
which the anthropic SDK dispatches on), a whole response is the content it assembled.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from frontend.anthropic.translate import FIELD_NAMES, to_chat_request
from frontend.chat.preparation import REASONING, TEXT, TOOL_CALL, AgentServing, Turn, TurnEvent
from frontend.errors import ApiError, anthropic_error_body
from frontend.chat.protocol import JsonSchemaFormat, ResponseFormat
from frontend.http_responses import JSON_HEADERS, SSE_HEADERS, DisconnectAwareResponse, json_response

logger = logging.getLogger("ringserve.serving")


def sse(event: str, body: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


class AnthropicServingMessages(AgentServing):
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
        turn = await self.start_turn(request, chat, arrival, message_id, names=FIELD_NAMES, prompt_param="messages")
        if req.stream:
            return DisconnectAwareResponse(lambda send: self._stream(turn, message_id, send))
        return DisconnectAwareResponse(lambda send: self._complete(turn, message_id, send))

    async def count_tokens(self, request: Request) -> Response:
        req = await self.read(request, CountTokensRequest)
        return json_response({"input_tokens": await self.count_prompt_tokens(to_chat_request(req))})

    async def _complete(self, turn: Turn, message_id: str, send: Send) -> None:
        blocks = _Blocks()
        try:
            async with aclosing(turn.events()) as events:
                async for event in events:
                    blocks.add(event)
            blocks.close()
            status, headers, body = 200, JSON_HEADERS, self._message(turn, message_id, blocks.content, final=True)
        except Exception as e:
            error, body = _error_body(turn, e, message_id)
            status, headers = error.status, error.headers
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": orjson.dumps(body), "more_body": False})

    async def _stream(self, turn: Turn, message_id: str, send: Send) -> None:
        if turn.structured:           # a grammar the engine refuses is still an error response, not a stream
            try:
                await turn.start()
            except Exception as e:
                error, body = _error_body(turn, e, message_id)
                await send({"type": "http.response.start", "status": error.status, "headers": error.headers})
                await send({"type": "http.response.body", "body": orjson.dumps(body), "more_body": False})
                return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        body = "http.response.body"
        start = {"type": "message_start", "message": self._message(turn, message_id, [], final=False)}
        await send({"type": body, "body": sse("message_start", start) + sse("ping", {"type": "ping"}),
                    "more_body": True})
        blocks = _Blocks()
        try:
            async with aclosing(turn.events()) as events:
                async for event in events:
                    frames = blocks.add(event)
                    if frames:
                        await send({"type": body, "body": frames, "more_body": True})
            end = self._message(turn, message_id, blocks.content, final=True)
            delta = {"type": "message_delta",
                     "delta": {"stop_reason": end["stop_reason"], "stop_sequence": end["stop_sequence"]},
                     "usage": end["usage"]}
            frames = blocks.close() + sse("message_delta", delta) + sse("message_stop", {"type": "message_stop"})
        except Exception as e:  # the stream has started: report in-band, then end it
            frames = sse("error", _error_body(turn, e, message_id)[1])
        await send({"type": body, "body": frames, "more_body": False})

    def _message(self, turn: Turn, message_id: str, content: list[dict], *, final: bool) -> dict:
        stop_reason = stop_sequence = None
        if final:
            stop_reason, stop_sequence = _stop_reason(turn)
        return {
            "id": message_id, "type": "message", "role": "assistant", "model": self.ctx.model_name,
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": turn.output_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": turn.cached_tokens},
        }


def _error_body(turn: Turn, e: Exception, message_id: str) -> tuple[ApiError, dict]:
    error = turn.error(e)
    if error.status == 500:
        logger.exception("message %s failed", message_id)
    return error, anthropic_error_body(error.status, error.message, error.param)


def _stop_reason(turn: Turn) -> tuple[str, str | None]:
    if turn.finish_reason == "length":
        return "max_tokens", None
    if turn.stop_string is not None:
        return "stop_sequence", turn.stop_string
    if turn.tool_calls:
        return "tool_use", None
    return "end_turn", None


class _Blocks:
    """Turn events -> content blocks, and the stream frames that build them (content_block_start/delta/stop)."""

    def __init__(self):
        self.content: list[dict] = []
        self._open: str | None = None            # the kind of event the open block takes
        self._arguments = ""                      # the open tool_use block's JSON so far

    def add(self, event: TurnEvent) -> bytes:
        frames = b""
        if event.kind == TOOL_CALL or event.kind != self._open and event.kind in (TEXT, REASONING):
            frames += self._end_open()
            frames += self._start(event)
        index = len(self.content) - 1
        block = self.content[index]
        if event.kind == TEXT:
            block["text"] += event.text
            delta = {"type": "text_delta", "text": event.text}
        elif event.kind == REASONING:
            block["thinking"] += event.text
            delta = {"type": "thinking_delta", "thinking": event.text}
        elif event.kind == TOOL_CALL:
            return frames
        else:
            self._arguments += event.text
            delta = {"type": "input_json_delta", "partial_json": event.text}
        return frames + sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _start(self, event: TurnEvent) -> bytes:
        if event.kind == TEXT:
            block = {"type": "text", "text": ""}
        elif event.kind == REASONING:
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": event.text, "input": {}}
        self._open = event.kind if event.kind != TOOL_CALL else "tool_args"
        self.content.append(block)
        start = {"type": "content_block_start", "index": len(self.content) - 1, "content_block": dict(block)}
        return sse("content_block_start", start)

    def close(self) -> bytes:
        """End the message's blocks (a message with no block at all gets one empty text block)."""
        frames = b"" if self.content else self._start(TurnEvent(TEXT, ""))
        return frames + self._end_open()

    def _end_open(self) -> bytes:
        if self._open is None:
            return b""
        block = self.content[-1]
        if block["type"] == "tool_use":
            block["input"] = _tool_input(self._arguments)
            self._arguments = ""
        self._open = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1})


def _tool_input(arguments: str) -> dict:
    """The call's arguments as an object; arguments cut short (max_tokens) or malformed give {}."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
