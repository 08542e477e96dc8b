"""llama3_json: Llama 3.1/3.2 JSON calls, `<|python_tag|>{"name": N, "parameters": {...}}; {...}`.

An output is a call output when, after whitespace and an optional `<|python_tag|>`, it starts with `{`;
otherwise it is all content. Calls are separated by `;`. Text after the last call is content.
"""

from __future__ import annotations

from frontend.chat.tool_parsers.base import ToolCallStreamer, ToolParser
from frontend.chat.tool_parsers.json_call import JsonCallReader

PYTHON_TAG = "<|python_tag|>"
_WS = " \t\n\r"
_START, _CALL, _BETWEEN, _NEXT, _PASS = range(5)


class Llama3JsonStreamer(ToolCallStreamer):
    def __init__(self) -> None:
        super().__init__()
        self.state = _START
        self.lead = ""               # whitespace and python tag before the first call
        self.tag_matched = 0
        self.reader: JsonCallReader | None = None
        self.between = ""            # separator text after a call

    def _feed(self, text: str) -> None:
        i, n = 0, len(text)
        while i < n:
            state = self.state
            c = text[i]
            if state == _START:
                if self.tag_matched and c == PYTHON_TAG[self.tag_matched]:
                    self.tag_matched = (self.tag_matched + 1) % len(PYTHON_TAG)
                    self.lead += c
                    i += 1
                elif self.tag_matched == 0 and c in _WS:
                    self.lead += c
                    i += 1
                elif self.tag_matched == 0 and c == "<" and PYTHON_TAG not in self.lead:
                    self.tag_matched = 1
                    self.lead += c
                    i += 1
                elif self.tag_matched == 0 and c == "{":
                    self.between = self.lead        # replayed as content if this is no call after all
                    self._start_call(i)
                else:
                    self._give_up(self.lead)
            elif state == _CALL:
                reader = self.reader
                i = reader.feed(text, i)
                if reader.error is not None:
                    if reader.announced:
                        self.mark_broken()
                        self.state = _PASS
                    else:
                        self._give_up(self.between + "".join(reader.pieces))
                elif reader.done:
                    self.state, self.between = _BETWEEN, ""
            elif state in (_BETWEEN, _NEXT):
                if c in _WS:
                    self.between += c
                    i += 1
                elif c == ";" and state == _BETWEEN:
                    self.between += c
                    self.state = _NEXT
                    i += 1
                elif c == "{" and state == _NEXT:
                    self._start_call(i)
                else:
                    self._give_up(self.between)
            else:
                self.content.add(text[i:])
                return

    def _start_call(self, i: int) -> None:
        self.reader = JsonCallReader(self, self.offset + i)
        self.state = _CALL

    def _give_up(self, replay: str) -> None:
        self.content.add(replay)
        self.state = _PASS

    def _finish(self) -> None:
        if self.state == _START:
            self.content.add(self.lead)
        elif self.state == _CALL:
            self.reader.end_unfinished(self.between)
        elif self.state == _NEXT:
            self.content.add(self.between)


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    keeps_special_tokens = True

    def streamer(self) -> ToolCallStreamer:
        return Llama3JsonStreamer()
