"""mistral: `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`, content before the marker.

Mistral's chat templates check that tool-call ids are 9 alphanumeric characters, so this parser makes
ids of that shape (as vLLM's MistralToolCall does).
"""

from __future__ import annotations

import secrets
import string

from frontend.chat.tool_parsers.base import CALL, PASS, ToolParser
from frontend.chat.tool_parsers.json_call import JsonCallStreamer

BOT = "[TOOL_CALLS]"
_ALPHANUMERIC = string.ascii_letters + string.digits
_TEXT, _OPEN, _ITEM, _NEXT = range(4)


def mistral_tool_call_id() -> str:
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


class MistralStreamer(JsonCallStreamer):
    """Content, then `marker` and a JSON list of call objects; with an empty marker the list must open
    the output (the JSON-array format of forced calls). `held`: in _TEXT, what may be the start of the
    marker; then the marker and list syntax not yet known to belong to calls."""

    def __init__(self, marker: str = BOT, new_id=mistral_tool_call_id) -> None:
        super().__init__()
        self.marker = marker
        self.new_id = new_id

    def _step(self, text: str, i: int) -> int:
        state = self.state
        if state == _TEXT:
            end = self.until_marker(text, i, self.marker)
            if end is None:
                return len(text)
            self.held, self.state = self.marker, _OPEN
            return end
        if state == CALL:
            return self.read_call(text, i, _NEXT)
        c = text[i]
        if state == _ITEM and c == "{":
            self.start_call(self.offset + i - len(self.held))
            return i
        if state == _NEXT and c == "]":
            self.held, self.state = "", _TEXT if self.marker else PASS
            return i + 1
        return self.list_syntax(c, i, _OPEN, _ITEM, _NEXT)


class MistralToolParser(ToolParser):
    name = "mistral"
    keeps_special_tokens = True
    streamer_class = MistralStreamer
