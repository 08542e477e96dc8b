"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API as a layer over chat.

The request is translated into a chat request (responses/translate.py), after the stored conversation of
previous_response_id, prepared by the one chat preparation and run by the runner; this module writes the
run's steps as output items (message, reasoning, function_call). One `_Items` assembler serves both the
stream and the whole response, so item ids, texts and arguments agree between the two by construction
(Codex checks that streamed ids equal the final ones).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import msgspec
import orjson
from starlette.requests import Request
from starlette.responses import Response

from frontend.chat.output import CONTENT, REASONING, TOOL_CALL, turn_events
from frontend.chat.preparation import ChatPreparation
from frontend.chat.protocol import ChatMessage
from frontend.errors import ApiError, error_body, invalid
from frontend.http_responses import SSE_HEADERS, DisconnectAwareResponse, json_response, sse
from frontend.middleware import SCOPE_API_KEY
from frontend.responses.protocol import ResponsesRequest
from frontend.responses.store import ResponseStore
from frontend.responses.translate import FIELD_NAMES, input_messages, to_chat_request
from frontend.runner import Run, Step
from frontend.serving_engine import OpenAIServing, ServingContext

logger = logging.getLogger("ringserve.serving")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OpenAIServingResponses(OpenAIServing):
    """With several API keys, each key has its own store (its own bounds too): one key's holders can neither
    read, continue, delete nor evict another key's responses. With one key (or none) there is one store,
    shared by everyone who may call the server."""

    def __init__(self, ctx: ServingContext, stores: dict | None = None):
        super().__init__(ctx)
        self.chat = ChatPreparation(self)
        # by API key; shared by every model's handlers (a response id is the server's, whatever its model)
        self._stores: dict[int | None, ResponseStore] = {} if stores is None else stores

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
        prepared = await self.chat.prepare(chat, names=FIELD_NAMES, prompt_param="input")
        run = self.run(request, response_id, [prepared.prompt], [prepared.params], 1, arrival, keep_output=False,
                       parsers=prepared.parsers(1), structured=prepared.structured)
        wire = ResponsesWire(run, req, history + new_messages, store, self.ctx.model_name, self.tokenize)
        return run.respond(wire, req.stream)

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


class ResponsesWire:
    """A run as a Responses API response: output items, their stream events (numbered), the store."""

    stream_headers = SSE_HEADERS

    def __init__(self, run: Run, req: ResponsesRequest, messages: list[ChatMessage], store: ResponseStore,
                 model: str, tokenize: Callable[[str, bool], list[int]]):
        self.run = run
        self.req = req
        self.messages = messages           # the conversation so far: stored with the reply
        self.store = store
        self.model = model
        self.tokenize = tokenize           # counts the reasoning tokens of usage
        self.items = _Items()
        self.text = ""                     # the whole answer text and reasoning (the stored reply)
        self.reasoning = ""
        self.sequence = 0

    @property
    def status(self) -> str:
        return "incomplete" if self.run.choices[0].finish_reason == "length" else "completed"

    def head(self) -> bytes:
        start = self._response("in_progress", usage=False)
        return self._frames([{"type": "response.created", "response": start},
                             {"type": "response.in_progress", "response": start}])

    def frames(self, step: Step) -> bytes:
        return self._frames([event for kind, text in turn_events(step.text, step.parts)
                             for event in self._add(kind, text)])

    def take(self, step: Step) -> None:
        for kind, text in turn_events(step.text, step.parts):
            self._add(kind, text)

    def tail(self) -> bytes:
        frames = self._frames(self.items.close(self.status))
        final = self._finish()
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return frames + self._frames([{"type": kind, "response": final}])

    def body(self) -> dict:
        self.items.close(self.status)
        return self._finish()

    def error_frames(self, error: ApiError) -> bytes:
        return self._frames([{"type": "error", "code": str(error.status), "message": error.message,
                              "param": error.param}])

    def error_body(self, error: ApiError) -> dict:
        return error_body(error.status, error.message, error.param)

    def _add(self, kind: str, text: str) -> list[dict]:
        if kind == CONTENT:
            self.text += text
        elif kind == REASONING:
            self.reasoning += text
        return self.items.add(kind, text)

    def _frames(self, events: list[dict]) -> bytes:
        out = b""
        for event in events:
            event["sequence_number"] = self.sequence
            self.sequence += 1
            out += sse(event, event["type"])
        return out

    def _finish(self) -> dict:
        """The final response object; stored (with the conversation so far) when the request says store."""
        response = self._response(self.status, usage=True)
        if self.req.store:
            calls = [{"id": item["call_id"], "type": "function",
                      "function": {"name": item["name"], "arguments": item["arguments"]}}
                     for item in self.items.output if item["type"] == "function_call"]
            reply = ChatMessage(role="assistant", content=self.text, tool_calls=calls or None,
                                reasoning_content=self.reasoning or None)
            messages = [*self.messages, reply]
            size = len(orjson.dumps(response)) + len(msgspec.json.encode(messages))
            if not self.store.put(self.run.request_id, response, messages, size):
                logger.warning("response %s (%d bytes) is larger than the whole store; not stored",
                               self.run.request_id, size)
        return response

    def _response(self, status: str, *, usage: bool) -> dict:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        return {
            "id": self.run.request_id, "object": "response", "created_at": self.run.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.model, "output": self.items.output if usage else [],
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "tool_choice": msgspec.to_builtins(req.tool_choice) if req.tool_choice is not None else "auto",
            "tools": msgspec.to_builtins(req.tools or []), "truncation": "disabled", "user": req.user,
            "metadata": req.metadata or {}, "usage": self._usage() if usage else None,
        }

    def _usage(self) -> dict:
        # cache_write_tokens: the SDK requires an integer; ringserve does not count cache writes, so 0.
        run = self.run
        output_tokens = run.output_tokens
        reasoning_tokens = len(self.tokenize(self.reasoning, False)) if self.reasoning else 0
        return {"input_tokens": run.prompt_tokens,
                "input_tokens_details": {"cached_tokens": run.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, output_tokens)},
                "total_tokens": run.prompt_tokens + output_tokens}


class _Items:
    """Turn events (chat/output.turn_events) -> output items, and the stream events that build them."""

    def __init__(self):
        self.output: list[dict] = []
        self._open: str | None = None          # the kind of turn event the open item takes

    def add(self, kind: str, text: str) -> list[dict]:
        events = []
        if kind == TOOL_CALL or kind != self._open and kind in (CONTENT, REASONING):
            events += self._end_open("completed")
            events += self._start(kind, text)
        index = len(self.output) - 1
        item = self.output[index]
        where = {"item_id": item["id"], "output_index": index}
        if kind == CONTENT:
            item["content"][0]["text"] += text
            events.append({"type": "response.output_text.delta", **where, "content_index": 0,
                           "delta": text, "logprobs": []})
        elif kind == REASONING:
            item["content"][0]["text"] += text
            events.append({"type": "response.reasoning_text.delta", **where, "content_index": 0,
                           "delta": text})
        elif kind != TOOL_CALL:
            item["arguments"] += text
            events.append({"type": "response.function_call_arguments.delta", **where, "delta": text})
        return events

    def _start(self, kind: str, text: str) -> list[dict]:
        if kind == CONTENT:
            item = {"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        elif kind == REASONING:
            item = {"id": _new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": _new_id("call"), "name": text, "arguments": ""}
            part = None
        self._open = kind if kind != TOOL_CALL else "tool_args"
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
        events = [] if self.output else self._start(CONTENT, "")
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
