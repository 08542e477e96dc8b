"""hermes: Qwen2.5/Qwen3 and Hermes models, `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`.

Text outside the blocks is content. A partial `<tool_call>` at the end of a piece is held back until the
next piece says whether it is one. The last block may stay unclosed when the output ends.
"""

from __future__ import annotations

from frontend.chat.tool_parsers.base import CALL, WHITESPACE, ToolParser
from frontend.chat.tool_parsers.json_call import JsonCallStreamer

START, END = "<tool_call>", "</tool_call>"
_TEXT, _OPEN, _AFTER = range(3)


class HermesStreamer(JsonCallStreamer):
    """`held`: in _TEXT, what may be the start of START; in _OPEN, the block's text before its '{'."""

    block_start = 0              # where the block began in the model text
    end_matched = 0              # characters of END matched after the object
    after = ""                   # text after the object, kept in case END does not follow

    def _step(self, text: str, i: int) -> int:
        state = self.state
        if state == _TEXT:
            end = self.until_marker(text, i, START)
            if end is None:
                return len(text)
            self.block_start = self.offset + end - len(START)
            self.held, self.state = START, _OPEN
            return end
        if state == CALL:
            return self.read_call(text, i, _AFTER)
        c = text[i]
        if state == _OPEN:
            if c in WHITESPACE:
                self.held += c
                return i + 1
            if c == "{":
                self.end_matched, self.after = 0, ""
                self.start_call(self.block_start)
            else:
                self.give_up(self.held)
            return i
        if self.end_matched == 0 and c in WHITESPACE:      # _AFTER the object
            self.after += c
            return i + 1
        if c == END[self.end_matched]:
            self.end_matched += 1
            if self.end_matched == len(END):
                self.state = _TEXT
            return i + 1
        self.give_up(self.after + END[:self.end_matched])   # no END: content from here on
        return i


class HermesToolParser(ToolParser):
    name = "hermes"
    keeps_special_tokens = True
    streamer_class = HermesStreamer
