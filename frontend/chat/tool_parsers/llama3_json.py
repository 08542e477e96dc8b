"""llama3_json: Llama 3.1/3.2 JSON calls, `<|python_tag|>{"name": N, "parameters": {...}}; {...}`.

An output is a call output when, after whitespace and an optional `<|python_tag|>`, it starts with `{`;
otherwise it is all content. Calls are separated by `;`. Text after the last call is content.
"""

from __future__ import annotations

from frontend.chat.tool_parsers.base import CALL, WHITESPACE, ToolParser
from frontend.chat.tool_parsers.json_call import JsonCallStreamer

PYTHON_TAG = "<|python_tag|>"
_START, _BETWEEN, _NEXT = range(3)


class Llama3JsonStreamer(JsonCallStreamer):
    """`held`: the whitespace and python tag before the first call, then the separator after a call."""

    tag_matched = 0              # characters of PYTHON_TAG matched

    def _step(self, text: str, i: int) -> int:
        state = self.state
        if state == CALL:
            return self.read_call(text, i, _BETWEEN)
        c = text[i]
        if state == _START:               # whitespace and the python tag before the first call
            if self.tag_matched:
                if c != PYTHON_TAG[self.tag_matched]:
                    self.give_up(self.held)
                    return i
                self.tag_matched = (self.tag_matched + 1) % len(PYTHON_TAG)
            elif c == "{":
                self.start_call(self.offset + i)          # held is replayed as content if this is no call
                return i
            elif c == "<" and PYTHON_TAG not in self.held:
                self.tag_matched = 1
            elif c not in WHITESPACE:
                self.give_up(self.held)
                return i
            self.held += c
            return i + 1
        if c in WHITESPACE:                      # after a call (_BETWEEN), or after its ';' (_NEXT)
            self.held += c
            return i + 1
        if c == ";" and state == _BETWEEN:
            self.held += c
            self.state = _NEXT
            return i + 1
        if c == "{" and state == _NEXT:
            self.start_call(self.offset + i)
        else:
            self.give_up(self.held)
        return i

class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    keeps_special_tokens = True
    streamer_class = Llama3JsonStreamer
