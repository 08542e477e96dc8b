"""HTTP response helpers every API shares: orjson bodies, the one SSE framer, and the response that aborts
its work when the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),      # proxies must not buffer a token stream
]
JSON_HEADERS = [(b"content-type", b"application/json")]


def json_response(body, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def sse(body, event: str | None = None) -> bytes:
    """One server-sent event: `data: <json>`, after an `event: <name>` line when the API names its events
    (Anthropic's and the Responses API's streams; OpenAI's chat and completions streams do not)."""
    data = b"data: " + orjson.dumps(body) + b"\n\n"
    return data if event is None else b"event: " + event.encode() + b"\n" + data


class DisconnectAwareResponse:
    """Runs `produce(send)` as the response; if the client disconnects first, produce is cancelled.

    Cancelling the request's own task (rather than running produce in a second one) keeps one task per
    request on the hot path; a small watcher task waits for ASGI's http.disconnect. Cancellation closes the
    engine streams produce was reading, which aborts their requests in the engine.
    """

    __slots__ = ("_produce", "_running", "_disconnected")

    def __init__(self, produce: Callable[[Send], Awaitable[None]]):
        self._produce = produce
        self._running = False
        self._disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        self._running = True
        watcher = asyncio.create_task(self._watch(receive, task))
        try:
            await self._produce(send)
        except asyncio.CancelledError:
            if not self._disconnected:
                raise
            if hasattr(task, "uncancel"):   # 3.11+: undo the count of the cancel; 3.10 keeps none
                task.uncancel()
        finally:
            self._running = False
            watcher.cancel()

    async def _watch(self, receive: Receive, task: asyncio.Task) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        # Only while produce runs: the handler task is then suspended inside it, so the cancellation
        # lands there and nowhere else.
        if self._running:
            self._disconnected = True
            task.cancel()
