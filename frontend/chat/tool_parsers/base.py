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

WHITESPACE = " \t\n\r"
# States every format has besides its own (numbered from 0, the first): reading a call, and passing (what
# looked like calls was none: the rest of the output is content).
PASS, CALL = -1, -2


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
            text = text.lstrip(WHITESPACE)
            self.after_call = not text
        if not text:
            return
        body = text.rstrip(WHITESPACE)
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
    """Turns pieces of model text into ParsedDeltas. A format is a state machine: `_step` makes one move,
    appending to `self.content` and `self.calls_out` (through `announce` and `arguments`); `feed`/`finish`
    package what one piece produced. Text a format holds back (`held`: what may still turn out to be a
    call's opening) is content if the output ends there; in state PASS (`give_up`) everything is content."""

    state = 0                          # every format numbers its states from its first, 0
    held = ""

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
        stop = 0 if self.state == PASS else self._feed(text)
        if self.state == PASS:
            self.content.add(text[stop:])
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

    def give_up(self, replay: str) -> None:
        """What looked like a call is none: its text so far (`replay`) is content, and so is the rest."""
        self.content.add(replay)
        self.held, self.state = "", PASS

    def until_marker(self, text: str, i: int, marker: str) -> int | None:
        """Content up to `marker` in held + text[i:]: where the marker ends in text, or None when it is not
        there yet (a partial marker at the end is held back until the next piece says)."""
        buffer = self.held + text[i:]
        at = buffer.find(marker)
        if at < 0:
            keep = longest_prefix_suffix(buffer, marker)
            self.content.add(buffer[:len(buffer) - keep])
            self.held = buffer[len(buffer) - keep:]
            return None
        self.content.add(buffer[:at])
        return i + at + len(marker) - len(self.held)

    def list_syntax(self, c: str, i: int, opening: int, item: int, following: int) -> int:
        """The list syntax of the formats whose calls come as a list (`[a, b]`), at character c = text[i]:
        whitespace is held, `[` in state `opening` or `,` in state `following` (after an item) wait for an
        item (state `item`); anything else means these were no calls."""
        if c in WHITESPACE:
            self.held += c
            return i + 1
        if c == "[" and self.state == opening or c == "," and self.state == following:
            self.held += c
            self.state = item
            return i + 1
        self.give_up(self.held)
        return i

    def new_id(self) -> str:
        return make_tool_call_id()

    def _take(self) -> ParsedDelta:
        text = self.content.take()
        self.content_length += len(text)
        calls, self.calls_out = self.calls_out, []
        return ParsedDelta(text, calls)

    def _feed(self, text: str) -> int:
        """Read `text`; returns where it stopped: its end, or where the streamer passed (state PASS)."""
        i, n = 0, len(text)
        while i < n and self.state != PASS:
            i = self._step(text, i)
        return i

    def _step(self, text: str, i: int) -> int:
        """One move of the format's state machine at text[i]; returns where the next move starts."""
        raise NotImplementedError

    def _finish(self) -> None:
        """The output ended: the text held back is content (whitespace next to a call is not)."""
        if self.state != PASS:
            self.content.add(self.held)


class ToolParser:
    """A tool-call format: `streamer()` for streams, `extract(text)` for whole outputs."""

    name = ""
    # Its markers may be special tokens (Mistral's [TOOL_CALLS], Llama's <|python_tag|>, <tool_call> in
    # some Hermes tokenizers), which detokenizing with skip_special_tokens would remove (as vLLM, the
    # request then keeps them).
    keeps_special_tokens = False
    streamer_class: type[ToolCallStreamer]

    def streamer(self) -> ToolCallStreamer:
        return self.streamer_class()

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
