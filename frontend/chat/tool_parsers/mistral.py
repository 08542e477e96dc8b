"""mistral: `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`, content before the marker.

Mistral's chat templates check that tool-call ids are 9 alphanumeric characters, so this parser makes
ids of that shape (as vLLM's MistralToolCall does).
"""

from __future__ import annotations

import secrets
import string

from frontend.chat.tool_parsers.base import ToolCallStreamer, ToolParser, longest_prefix_suffix
from frontend.chat.tool_parsers.json_call import JsonCallReader

BOT = "[TOOL_CALLS]"
_ALPHANUMERIC = string.ascii_letters + string.digits
_WS = " \t\n\r"
_TEXT, _OPEN, _ITEM, _CALL, _NEXT, _PASS = range(6)


def mistral_tool_call_id() -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


class MistralStreamer(ToolCallStreamer):
    """Content, then `marker` and a JSON list of call objects; with an empty marker the list must open
    the output (the JSON-array format of forced calls)."""

    def __init__(self, marker: str = BOT, new_id=mistral_tool_call_id) -> None:
        super().__init__()
        self.marker = marker
        self.new_id = new_id
        self.state = _TEXT
        self.pending = ""
        self.held = ""               # marker and list syntax not yet known to belong to calls
        self.reader: JsonCallReader | None = None

    def _feed(self, text: str) -> None:
        i, n = 0, len(text)
        while i < n:
            state = self.state
            if state == _TEXT:
                buffer = self.pending + text[i:]
                at = buffer.find(self.marker)
                if at < 0:
                    keep = longest_prefix_suffix(buffer, self.marker)
                    self.content.add(buffer[:len(buffer) - keep])
                    self.pending = buffer[len(buffer) - keep:]
                    return
                self.content.add(buffer[:at])
                i += at + len(self.marker) - len(self.pending)
                self.pending, self.held, self.state = "", self.marker, _OPEN
                continue
            c = text[i]
            if state == _CALL:
                reader = self.reader
                i = reader.feed(text, i)
                if reader.error is not None:
                    if reader.announced:
                        self.mark_broken()
                        self.state = _PASS
                    else:
                        self._give_up(self.held + "".join(reader.pieces))
                elif reader.done:
                    self.state, self.held = _NEXT, ""
            elif state == _PASS:
                self.content.add(text[i:])
                return
            elif c in _WS:
                self.held += c
                i += 1
            elif state == _OPEN and c == "[":
                self.held += c
                self.state = _ITEM
                i += 1
            elif state == _ITEM and c == "{":
                self.reader = JsonCallReader(self, self.offset + i - len(self.held))
                self.state = _CALL
            elif state == _NEXT and c == ",":
                self.held += c
                self.state = _ITEM
                i += 1
            elif state == _NEXT and c == "]":
                self.state, self.held = _TEXT if self.marker else _PASS, ""
                i += 1
            else:
                self._give_up(self.held)

    def _give_up(self, replay: str) -> None:
        self.content.add(replay)
        self.state = _PASS

    def _finish(self) -> None:
        if self.state == _TEXT:
            self.content.add(self.pending)
        elif self.state in (_OPEN, _ITEM):
            self.content.add(self.held)
        elif self.state == _CALL:
            self.reader.end_unfinished(self.held)


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True

    def streamer(self) -> ToolCallStreamer:
        return MistralStreamer()
