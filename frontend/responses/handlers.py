"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API as a layer over chat.

The request is translated into a chat request (responses_translate), after the stored conversation of
previous_response_id, and run as one chat Turn; the turn's events become output items (message, reasoning,
function_call). One `_Items` assembler serves both the stream and the whole response, so item ids, texts and
arguments agree between the two by construction (Codex checks that streamed ids equal the final ones).
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing

import msgspec
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Send

from frontend.chat.preparation import REASONING, TEXT, TOOL_CALL, AgentServing, Turn, TurnEvent
from frontend.errors import ApiError, error_body, invalid
from frontend.middleware import SCOPE_API_KEY
from frontend.chat.protocol import ChatMessage
from frontend.responses.store import ResponseStore
from frontend.http_responses import JSON_HEADERS, SSE_HEADERS, DisconnectAwareResponse, json_response
from frontend.responses.protocol import ResponsesRequest
from frontend.responses.translate import FIELD_NAMES, input_messages, to_chat_request
from frontend.serving_engine import ServingContext

logger = logging.getLogger("ringserve.serving")


def sse(body: dict) -> bytes:
    return b"event: " + body["type"].encode() + b"\ndata: " + orjson.dumps(body) + b"\n\n"


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OpenAIServingResponses(AgentServing):
    """With several API keys, each key has its own store (its own bounds too): one key's holders can neither
    read, continue, delete nor evict another key's responses. With one key (or none) there is one store,
    shared by everyone who may call the server."""

    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self._stores: dict[int | None, ResponseStore] = {}

    def store_for(self, request: Request) -> ResponseStore:
        """The store of the API key the request was authorized with."""
        key = request.scope.get(SCOPE_API_KEY)
        store = self._stores.get(key)
        if store is None:
            config = self.ctx.config
            store = self._stores[key] = ResponseStore(config.responses_store_max_entries,
                                                      config.responses_store_max_bytes, config.responses_store_ttl)
        return store

    async def create_response(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, ResponsesRequest)
        self.check_engine()
        if req.background:
            raise invalid("background responses are not supported", "background")
        history: list[ChatMessage] = []
        store = self.store_for(request)
        if req.previous_response_id is not None:
            previous = store.get(req.previous_response_id)
            if previous is None:
                raise invalid(f"Previous response with id '{req.previous_response_id}' not found (it was never "
                              "stored, or it expired or was evicted from the store).", "previous_response_id")
            history = previous.messages
        new_messages = input_messages(req)
        chat = to_chat_request(req, history, new_messages)
        response_id = _new_id("resp")
        turn = await self.start_turn(request, chat, arrival, response_id, names=FIELD_NAMES, prompt_param="input")
        job = _Job(req, response_id, turn, history + new_messages, store)
        if req.stream:
            return DisconnectAwareResponse(lambda send: self._stream(job, send))
        return DisconnectAwareResponse(lambda send: self._complete(job, send))

    async def get_response(self, request: Request) -> Response:
        entry = self.store_for(request).get(request.path_params["response_id"])
        if entry is None:
            raise ApiError(404, f"Response with id '{request.path_params['response_id']}' not found.",
                           "response_id")
        return json_response(entry.response)

    async def delete_response(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        if not self.store_for(request).delete(response_id):
            raise ApiError(404, f"Response with id '{response_id}' not found.", "response_id")
        return json_response({"id": response_id, "object": "response.deleted", "deleted": True})

    async def _complete(self, job: _Job, send: Send) -> None:
        try:
            async with aclosing(job.turn.events()) as events:
                async for event in events:
                    job.items.add(event)
            job.items.close(job.status)
            status, headers, body = 200, JSON_HEADERS, self._finish(job)
        except Exception as e:
            error = _error(job, e)
            status, headers, body = error.status, error.headers, error_body(error.status, error.message, error.param)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": orjson.dumps(body), "more_body": False})

    async def _stream(self, job: _Job, send: Send) -> None:
        if job.turn.structured:       # a grammar the engine refuses is still an error response, not a stream
            try:
                await job.turn.start()
            except Exception as e:
                error = _error(job, e)
                await send({"type": "http.response.start", "status": error.status, "headers": error.headers})
                await send({"type": "http.response.body", "more_body": False,
                            "body": orjson.dumps(error_body(error.status, error.message, error.param))})
                return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        body = "http.response.body"
        start = self._response(job, "in_progress", usage=False)
        frames = job.frames([{"type": "response.created", "response": start},
                             {"type": "response.in_progress", "response": start}])
        await send({"type": body, "body": frames, "more_body": True})
        try:
            async with aclosing(job.turn.events()) as events:
                async for event in events:
                    frames = job.frames(job.items.add(event))
                    if frames:
                        await send({"type": body, "body": frames, "more_body": True})
            frames = job.frames(job.items.close(job.status))
            final = self._finish(job)
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            frames += job.frames([{"type": kind, "response": final}])
        except Exception as e:  # the stream has started: report in-band, then end it
            error = _error(job, e)
            frames = job.frames([{"type": "error", "code": str(error.status), "message": error.message,
                                  "param": error.param}])
        await send({"type": body, "body": frames, "more_body": False})

    def _finish(self, job: _Job) -> dict:
        """The final response object; stored (with the conversation so far) when the request says store."""
        response = self._response(job, job.status, usage=True)
        if job.req.store:
            turn = job.turn
            calls = [{"id": item["call_id"], "type": "function",
                      "function": {"name": item["name"], "arguments": item["arguments"]}}
                     for item in job.items.output if item["type"] == "function_call"]
            reply = ChatMessage(role="assistant", content=turn.text, tool_calls=calls or None,
                                reasoning_content=turn.reasoning or None)
            messages = [*job.messages, reply]
            size = len(orjson.dumps(response)) + len(msgspec.json.encode(messages))
            if not job.store.put(job.response_id, response, messages, size):
                logger.warning("response %s (%d bytes) is larger than the whole store; not stored",
                               job.response_id, size)
        return response

    def _response(self, job: _Job, status: str, *, usage: bool) -> dict:
        req, turn = job.req, job.turn
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        return {
            "id": job.response_id, "object": "response", "created_at": turn.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.ctx.model_name, "output": job.items.output if usage else [],
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "tool_choice": msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
            "tools": msgspec.to_builtins(req.tools or []), "truncation": "disabled", "user": req.user,
            "metadata": req.metadata or {}, "usage": self._usage(turn) if usage else None,
        }

    def _usage(self, turn: Turn) -> dict:
        # cache_write_tokens: the SDK requires an integer; ringserve does not count cache writes, so 0.
        reasoning_tokens = len(self.tokenize(turn.reasoning, False)) if turn.reasoning else 0
        return {"input_tokens": turn.prompt_tokens,
                "input_tokens_details": {"cached_tokens": turn.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": turn.output_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, turn.output_tokens)},
                "total_tokens": turn.prompt_tokens + turn.output_tokens}


def _error(job: _Job, e: Exception) -> ApiError:
    error = job.turn.error(e)
    if error.status == 500:
        logger.exception("response %s failed", job.response_id)
    return error


class _Job:
    """One Responses request on its way: the request, its turn, its output items and stream numbering."""

    def __init__(self, req: ResponsesRequest, response_id: str, turn: Turn, messages: list[ChatMessage],
                 store: ResponseStore):
        self.req = req
        self.store = store
        self.response_id = response_id
        self.turn = turn
        self.messages = messages
        self.items = _Items()
        self.sequence = 0

    @property
    def status(self) -> str:
        return "incomplete" if self.turn.finish_reason == "length" else "completed"

    def frames(self, events: list[dict]) -> bytes:
        out = b""
        for event in events:
            event["sequence_number"] = self.sequence
            self.sequence += 1
            out += sse(event)
        return out


class _Items:
    """Turn events -> output items, and the stream events that build them."""

    def __init__(self):
        self.output: list[dict] = []
        self._open: str | None = None          # the kind of turn event the open item takes

    def add(self, event: TurnEvent) -> list[dict]:
        events = []
        if event.kind == TOOL_CALL or event.kind != self._open and event.kind in (TEXT, REASONING):
            events += self._end_open("completed")
            events += self._start(event)
        index = len(self.output) - 1
        item = self.output[index]
        where = {"item_id": item["id"], "output_index": index}
        if event.kind == TEXT:
            item["content"][0]["text"] += event.text
            events.append({"type": "response.output_text.delta", **where, "content_index": 0,
                           "delta": event.text, "logprobs": []})
        elif event.kind == REASONING:
            item["content"][0]["text"] += event.text
            events.append({"type": "response.reasoning_text.delta", **where, "content_index": 0,
                           "delta": event.text})
        elif event.kind != TOOL_CALL:
            item["arguments"] += event.text
            events.append({"type": "response.function_call_arguments.delta", **where, "delta": event.text})
        return events

    def _start(self, event: TurnEvent) -> list[dict]:
        if event.kind == TEXT:
            item = {"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        elif event.kind == REASONING:
            item = {"id": _new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": _new_id("call"), "name": event.text, "arguments": ""}
            part = None
        self._open = event.kind if event.kind != TOOL_CALL else "tool_args"
        self.output.append(item)
        index = len(self.output) - 1
        events = [{"type": "response.output_item.added", "output_index": index, "item": _copy(item)}]
        if part is not None:
            item["content"].append(part)
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": dict(part)})
        return events

    def close(self, status: str) -> list[dict]:
        """End the output (an output with no item at all gets one empty message)."""
        events = [] if self.output else self._start(TurnEvent(TEXT, ""))
        return events + self._end_open(status)

    def _end_open(self, status: str) -> list[dict]:
        if self._open is None:
            return []
        self._open = None
        index = len(self.output) - 1
        item = self.output[index]
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            events = [{"type": "response.function_call_arguments.done", **where, "name": item["name"],
                       "arguments": item["arguments"]}]
        else:
            part = item["content"][0]
            if item["type"] == "message":
                done = {"type": "response.output_text.done", **where, "content_index": 0, "text": part["text"],
                        "logprobs": []}
            else:
                done = {"type": "response.reasoning_text.done", **where, "content_index": 0, "text": part["text"]}
            events = [done, {"type": "response.content_part.done", **where, "content_index": 0, "part": dict(part)}]
        return [*events, {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]


def _copy(item: dict) -> dict:
    """A snapshot of an item for an event (the item itself keeps growing)."""
    return {**item, "content": [dict(part) for part in item["content"]]} if "content" in item else dict(item)
