"""One `{"name": N, "arguments": {...}}` call object read as it streams (hermes, llama3_json, mistral), and
the streamer base of those formats: the one place where a broken call turns back into content.

The reader announces the call once its name is complete and then forwards the raw text of the arguments
value as it arrives (`"parameters"` is accepted for `"arguments"`, as Llama 3.1 writes it). Arguments given
as a JSON string (`"arguments": "{\\"a\\": 1}"`) are decoded once the string ends. A call without arguments
gets `{}`.
"""

from __future__ import annotations

import json

from frontend.chat.tool_parsers.base import CALL, PASS, ToolCallStreamer
from frontend.chat.tool_parsers.json_scan import JsonScanner

ARGUMENT_KEYS = ("arguments", "parameters")
MAX_NAME_CHARS = 256


class JsonCallReader:
    __slots__ = ("scanner", "streamer", "block_start", "pieces", "index", "sent", "error", "string_arguments")

    def __init__(self, streamer: ToolCallStreamer, block_start: int):
        self.scanner = JsonScanner()
        self.streamer = streamer
        self.block_start = block_start      # offset in the model text where this call's block began
        self.pieces: list[str] = []
        self.index: int | None = None       # set once announced
        self.sent = 0                        # scanner offset up to which arguments were forwarded
        self.error: str | None = None
        self.string_arguments: bool | None = None   # the arguments value is a JSON string (known at its start)

    @property
    def done(self) -> bool:
        return self.scanner.done and self.error is None

    @property
    def announced(self) -> bool:
        return self.index is not None

    def end_unfinished(self, held: str) -> None:
        """The output ended inside this call: an announced call is broken; an unannounced one was text after
        all (`held`, the parser's text before the call, then what the reader took)."""
        if self.announced:
            self.streamer.mark_broken()
        else:
            self.streamer.content.add(held + "".join(self.pieces))

    def feed(self, text: str, start: int) -> int:
        """Read text[start:] up to the end of the object; returns where it stopped. The first piece must
        start at the object's '{' (callers check that before making a reader)."""
        scanner = self.scanner
        base = scanner.pos - start          # scanner offset of text[0]
        stop = scanner.feed(text, start)
        self.pieces.append(text[start:stop])
        if scanner.error is not None:
            self.error = scanner.error
            return stop
        if self.index is None:
            self._announce(text, base)
        if self.index is not None:
            self._forward(text, base)
        if scanner.done and self.error is None:
            if self.index is None:
                self.error = 'a tool call object needs a "name"'
            elif not any(key in scanner.members for key in ARGUMENT_KEYS):
                self.streamer.arguments(self.index, "{}")
        return stop

    def _text(self, text: str, base: int, a: int, b: int) -> str:
        """Scanner offsets [a, b) as text: from this piece when it holds them, else from all pieces."""
        if a >= base:
            return text[a - base:b - base]
        return "".join(self.pieces)[a:b]

    def _announce(self, text: str, base: int) -> None:
        span = self.scanner.members.get("name")
        if span is None or not self.scanner.past_member:     # announce only once the name's ',' is seen
            return
        try:
            name = json.loads(self._text(text, base, *span))
        except ValueError:
            name = None
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            self.error = 'a tool call\'s "name" must be a non-empty string'
            return
        self.index = self.streamer.announce(name, self.block_start)

    def _forward(self, text: str, base: int) -> None:
        scanner = self.scanner
        span = next((scanner.members[k] for k in ARGUMENT_KEYS if k in scanner.members), None)
        complete = span is not None
        if span is None:
            open_member = scanner.open_member
            if open_member is None or open_member[0] not in ARGUMENT_KEYS:
                return
            span = (open_member[1], scanner.pos)
        a, b = max(span[0], self.sent), span[1]
        if b <= a:
            return
        if self.string_arguments is None:
            self.string_arguments = self._text(text, base, span[0], span[0] + 1) == '"'
        if self.string_arguments:
            if complete:
                try:
                    self.streamer.arguments(self.index, json.loads(self._text(text, base, *span)))
                except ValueError:
                    self.error = "the arguments string is not valid JSON"
                self.sent = b
            return
        self.streamer.arguments(self.index, self._text(text, base, a, b))
        self.sent = b


class JsonCallStreamer(ToolCallStreamer):
    """A format whose calls are JSON objects: `start_call` at an object's '{', then `read_call` (state CALL)."""

    reader: JsonCallReader | None = None

    def start_call(self, block_start: int) -> None:
        """A call object starts here; its block (with `held`, the format's text before the '{') began at
        offset block_start of the model text."""
        self.reader = JsonCallReader(self, block_start)
        self.state = CALL

    def read_call(self, text: str, i: int, then: int) -> int:
        """Read text[i:] into the current call; returns where it stopped. A complete call hands over to the
        format's state `then`, holding nothing back. A call that breaks was content all along when it was
        not announced yet (`held`, then what the reader took), and breaks the stream's call otherwise (a
        stream cannot take the announcement back): the rest is content."""
        reader = self.reader
        i = reader.feed(text, i)
        if reader.error is None:
            if reader.done:
                self.held, self.state = "", then
            return i
        if reader.announced:
            self.mark_broken()
            self.held, self.state = "", PASS
        else:
            self.give_up(self.held + "".join(reader.pieces))
        return i

    def _finish(self) -> None:
        if self.state == CALL:
            self.reader.end_unfinished(self.held)
        else:
            super()._finish()
