"""The one response runner: an API request's engine requests (its choices) run as typed steps, which each
API writes in its own wire format (its `Wire`), as a stream or as one body.

What every API shares lives here once:
- each choice's engine stream, read through its output parser (chat: reasoning, tool calls) when it has
  one, and several choices' streams merged in arrival order (n > 1, several prompts);
- a stream with a grammar constraint waits for its first step before it sends anything, so that a grammar
  the engine fails on is still an error response with its own status (naming the constraint's field);
- a client that leaves cancels the response (DisconnectAwareResponse), which closes the engine streams and
  so aborts their requests;
- an engine failure (its death, a shutdown past the deadline, a request it refuses) is an error response
  before a stream starts and an in-band error (in the API's shape) once it has.

A Wire only translates: `head`, `frames(step)` and `tail` make a stream, `take(step)` and `body` a whole
response, `error_frames` and `error_body` the failures. The per-token hot path is one step of plain text:
one tuple, one `frames` call, one `send`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import NamedTuple, Protocol

import orjson
from starlette.types import Send

from engine.client.base import AsyncEngine
from engine.errors import request_error
from engine.outputs import RequestDelta
from frontend.choices import Choice
from frontend.errors import ApiError, from_engine_error
from frontend.http_responses import JSON_HEADERS, DisconnectAwareResponse

logger = logging.getLogger("ringserve.serving")
_BODY = "http.response.body"


class Step(NamedTuple):
    """One engine step of one choice: the typed event a Wire translates."""

    choice: Choice
    text: str                   # the text this step made final (raw model text)
    delta: RequestDelta         # its token ids, logprobs, prompt logprobs
    parts: list | None          # the text read by the choice's output parser (chat.output.Part), if it has one
    finished: bool              # the choice ended with this step (choice.finish_reason says why)


class OutputParser(Protocol):
    """Reads one choice's text as it streams (chat.output.ChatOutputParser)."""

    def feed(self, text: str) -> list: ...

    def finish(self) -> list: ...


class Wire(Protocol):
    """How one API writes a run: the frames of a stream, or one body."""

    stream_headers: list[tuple[bytes, bytes]]

    def head(self) -> bytes: ...                      # a stream's frames before any step

    def frames(self, step: Step) -> bytes: ...       # a stream's frames of one step (b"": none)

    def tail(self) -> bytes: ...                      # a stream's last frames, after the last step

    def error_frames(self, error: ApiError) -> bytes: ...   # a started stream's failure; ends the stream

    def take(self, step: Step) -> None: ...           # a whole response: one step

    def body(self) -> dict: ...                       # a whole response, after the last step

    def error_body(self, error: ApiError) -> dict: ...      # a failure before anything was sent


class Run:
    """One API request's choices on their way through the engine."""

    def __init__(self, engine: AsyncEngine, request_id: str, choices: list[Choice], *, prompt_tokens: int,
                 parsers: list[OutputParser] | None = None, priority: int = 0, cache_salt: str | None = None,
                 data_parallel_rank: int | None = None, structured: str | None = None,
                 local_paths: dict[str, str] | None = None):
        self.engine = engine
        self.request_id = request_id
        self.choices = choices
        self.prompt_tokens = prompt_tokens          # each prompt counted once, whatever n is
        self.parsers = parsers                      # per choice index
        self.priority = priority
        self.cache_salt = cache_salt
        self.data_parallel_rank = data_parallel_rank   # X-data-parallel-rank: the engine it is pinned to
        self.structured = structured                # the API field of its grammar constraint, if any
        self.local_paths = local_paths              # paths an engine error may name -> what clients see
        self.created = int(time.time())

    @property
    def output_tokens(self) -> int:
        return sum(choice.num_output_tokens for choice in self.choices)

    @property
    def cached_tokens(self) -> int:
        return sum(choice.num_cached_tokens for choice in self.choices)

    def steps(self) -> AsyncIterator[Step]:
        """Every choice's steps in arrival order; closing the iterator early aborts the engine requests."""
        parsers = self.parsers
        streams = [stream_choice(self.engine, choice, parsers[choice.index] if parsers else None,
                                 priority=self.priority, cache_salt=self.cache_salt,
                                 data_parallel_rank=self.data_parallel_rank)
                   for choice in self.choices]
        return streams[0] if len(streams) == 1 else merge_streams(streams)

    def error(self, e: Exception) -> ApiError:
        """What failed the run, as the API error it is (local paths hidden); an engine-side failure of a
        constrained request (its grammar) names the constraint's field."""
        error = from_engine_error(e, self.local_paths)
        if error.status == 400 and error.param is None and self.structured is not None:
            error.param = self.structured
        if error.status == 500:
            logger.error("request %s failed: %s: %s", self.request_id, type(e).__name__, e, exc_info=e)
        return error

    def respond(self, wire: Wire, stream: bool) -> DisconnectAwareResponse:
        if stream:
            return DisconnectAwareResponse(lambda send: self._stream(wire, send))
        return DisconnectAwareResponse(lambda send: self._whole(wire, send))

    async def _stream(self, wire: Wire, send: Send) -> None:
        async with aclosing(self.steps()) as steps:
            first = None
            if self.structured:
                try:
                    first = await steps.__anext__()
                except StopAsyncIteration:
                    pass
                except Exception as e:  # nothing was sent yet: answer with the error's own status
                    await _send_whole(send, *self._failure(wire, e))
                    return
            await send({"type": "http.response.start", "status": 200, "headers": wire.stream_headers})
            try:
                frames = wire.head()
                if first is not None:
                    frames += wire.frames(first)
                if frames:
                    await send({"type": _BODY, "body": frames, "more_body": True})
                async for step in steps:
                    frames = wire.frames(step)
                    if frames:
                        await send({"type": _BODY, "body": frames, "more_body": True})
                frames = wire.tail()
            except Exception as e:  # the stream has started: report in-band, then end it properly
                frames = wire.error_frames(self.error(e))
            await send({"type": _BODY, "body": frames, "more_body": False})

    async def _whole(self, wire: Wire, send: Send) -> None:
        try:
            async with aclosing(self.steps()) as steps:
                async for step in steps:
                    wire.take(step)
            status, headers, body = 200, JSON_HEADERS, wire.body()
        except Exception as e:
            status, headers, body = self._failure(wire, e)
        await _send_whole(send, status, headers, body)

    def _failure(self, wire: Wire, e: Exception) -> tuple[int, list, dict]:
        error = self.error(e)
        return error.status, error.headers, wire.error_body(error)


async def _send_whole(send: Send, status: int, headers: list, body: dict) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": _BODY, "body": orjson.dumps(body), "more_body": False})


async def stream_choice(engine: AsyncEngine, choice: Choice, parser: OutputParser | None = None, *,
                        priority: int = 0, cache_salt: str | None = None,
                        data_parallel_rank: int | None = None) -> AsyncIterator[Step]:
    """One step per engine step until the choice finishes (a stop string ends it early); closing it aborts
    the engine request. With a parser, each step's text is fed to it, and finished with the choice."""
    stream = engine.generate(choice.request_id, choice.prompt_token_ids, choice.params, priority=priority,
                             cache_salt=cache_salt, arrival_time=choice.arrival_time,
                             data_parallel_rank=data_parallel_rank)
    rejected = False
    try:
        async for delta in stream:
            if delta.finish_reason == "error":      # this request alone failed in the engine (its grammar)
                choice.process(delta)
                raise request_error(delta.error or "the request failed in the engine")
            text = choice.process(delta)
            finished = choice.finish_reason is not None
            if parser is None:
                yield Step(choice, text, delta, None, finished)
            else:
                parts = parser.feed(text)
                if finished:
                    parts += parser.finish()
                yield Step(choice, text, delta, parts, finished)
            if finished:
                return
    except ValueError:
        rejected = True           # the engine refused the request: it never ran, so it is no abort
        raise
    finally:
        await stream.aclose()     # aborts the engine request unless it already finished
        if choice.finish_reason is None and not rejected:
            choice.finish("abort")


async def merge_streams(streams: list[AsyncIterator[Step]]) -> AsyncIterator[Step]:
    """Interleave several choices' steps in arrival order; one task per stream (only for n > 1)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[Step]) -> None:
        try:
            async for step in stream:
                queue.put_nowait(step)
            queue.put_nowait(done)
        except Exception as e:     # handed to the consumer, which raises it
            queue.put_nowait(e)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
