"""What every tool-call parser shares: the call and delta types, the streamer interface, and `extract`,
which is the streamer run over the whole text, so a streamed response and a whole one agree by
construction.

A parser reads the model's *content* (after any reasoning was split off) in its own call format. Streaming
rules (OpenAI's shape): a call is announced by one delta holding its index, id and whole name; argument
fragments follow and concatenate to exactly the arguments of the whole response; text outside calls is
content, except whitespace next to a call. A parser never evaluates model text and uses no unbounded
backtracking regex.

Malformed output: when a block that looks like a call turns out not to be one before its name is known,
its text is content in both modes. When a call was already announced and its arguments then break (invalid
JSON, or the output was cut by max_tokens), a stream cannot take the announcement back; the whole response
instead drops that call and returns the text from its start as content (as vLLM does).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

_WHITESPACE = " \t\n\r"


def make_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str                      # JSON text, exactly as the model wrote it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ToolCallDelta:
    """One entry of a streamed `delta.tool_calls`: the first for a call has id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict:
        if self.name is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass(slots=True)
class ParsedDelta:
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass(slots=True)
class ExtractedToolCalls:
    content: str | None
    tool_calls: list[ToolCall]


class ContentBuffer:
    """Content as it streams, holding back a trailing whitespace run: it goes out with the next text, or
    is dropped when a call follows (and at the end when there were calls). Whitespace right after a call
    is dropped too."""

    __slots__ = ("held", "out", "after_call")

    def __init__(self) -> None:
        self.held = ""
        self.out: list[str] = []          # what the current feed emits
        self.after_call = False

    def add(self, text: str) -> None:
        if self.after_call:
            text = text.lstrip(_WHITESPACE)
            self.after_call = not text
        if not text:
            return
        body = text.rstrip(_WHITESPACE)
        if body:
            self.out.append(self.held + body)
            self.held = text[len(body):]
        else:
            self.held += text

    def drop_held(self) -> None:
        self.held = ""
        self.after_call = True

    def take(self) -> str:
        text = "".join(self.out)
        self.out.clear()
        return text


class ToolCallStreamer:
    """Turns pieces of model text into ParsedDeltas. Subclasses implement `_feed` and `_finish`, appending
    to `self.content` and `self.calls_out`; `feed`/`finish` package what one piece produced."""

    def __init__(self) -> None:
        self.content = ContentBuffer()
        self.calls_out: list[ToolCallDelta] = []
        self.num_calls = 0                 # calls announced so far
        self.offset = 0                    # characters of model text fed so far
        self.content_length = 0            # characters of content emitted so far
        # (content length, text offset) at the start of the last announced call, and of one that broke
        self._call_start = (0, 0)
        self.broken: tuple[int, int] | None = None

    def feed(self, text: str) -> ParsedDelta:
        self._feed(text)
        self.offset += len(text)
        return self._take()

    def finish(self) -> ParsedDelta:
        self._finish()
        if self.num_calls == 0:
            self.content.out.append(self.content.held)
        self.content.held = ""
        return self._take()

    def announce(self, name: str, block_start: int, call_id: str | None = None) -> int:
        """Start a call whose text began at offset block_start of the model text; returns its index."""
        self.content.drop_held()
        self._call_start = (self.content_length + sum(map(len, self.content.out)), block_start)
        index = self.num_calls
        self.num_calls += 1
        self.calls_out.append(ToolCallDelta(index, call_id or self.new_id(), name))
        return index

    def arguments(self, index: int, fragment: str) -> None:
        if not fragment:
            return
        last = self.calls_out[-1] if self.calls_out else None
        if last is not None and last.index == index and last.name is None:
            last.arguments += fragment
            return
        self.calls_out.append(ToolCallDelta(index, arguments=fragment))

    def mark_broken(self) -> None:
        """The last announced call turned out malformed (see the module doc)."""
        if self.broken is None:
            self.broken = self._call_start

    def new_id(self) -> str:
        return make_tool_call_id()

    def _take(self) -> ParsedDelta:
        text = self.content.take()
        self.content_length += len(text)
        calls, self.calls_out = self.calls_out, []
        return ParsedDelta(text, calls)

    def _feed(self, text: str) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError


class ToolParser:
    """A tool-call format: `streamer()` for streams, `extract(text)` for whole outputs."""

    name = ""
    # Its markers may be special tokens (Mistral's [TOOL_CALLS], Llama's <|python_tag|>, <tool_call> in
    # some Hermes tokenizers), which detokenizing with skip_special_tokens would remove (as vLLM, the
    # request then keeps them).
    keeps_special_tokens = False

    def streamer(self) -> ToolCallStreamer:
        raise NotImplementedError

    def extract(self, text: str) -> ExtractedToolCalls:
        streamer = self.streamer()
        pieces = [streamer.feed(text), streamer.finish()]
        content = "".join(p.content for p in pieces)
        calls: list[ToolCall] = []
        for piece in pieces:
            for delta in piece.tool_calls:
                if delta.name is not None:
                    calls.append(ToolCall(delta.id, delta.name, delta.arguments))
                else:
                    calls[delta.index].arguments += delta.arguments
        if streamer.broken is not None:
            content_length, start = streamer.broken
            calls = calls[:-1]
            content = content[:content_length] + text[start:]
        return ExtractedToolCalls(content or None, calls)


def longest_prefix_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of token (text that may still become
    the token when more arrives)."""
    for size in range(min(len(token) - 1, len(text)), 0, -1):
        if token.startswith(text[-size:]):
            return size
    return 0
