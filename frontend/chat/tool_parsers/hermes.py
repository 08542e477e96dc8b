"""hermes: Qwen2.5/Qwen3 and Hermes models, `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`.

Text outside the blocks is content. A partial `<tool_call>` at the end of a piece is held back until the
next piece says whether it is one. The last block may stay unclosed when the output ends.
"""

from __future__ import annotations

from frontend.chat.tool_parsers.base import ToolCallStreamer, ToolParser, longest_prefix_suffix
from frontend.chat.tool_parsers.json_call import JsonCallReader

START, END = "<tool_call>", "</tool_call>"
_WS = " \t\n\r"
_TEXT, _OPEN, _CALL, _AFTER, _PASS = range(5)


class HermesStreamer(ToolCallStreamer):
    def __init__(self) -> None:
        super().__init__()
        self.state = _TEXT
        self.pending = ""            # text that may be the start of START
        self.prefix = ""             # the block's text before its '{' (START and whitespace)
        self.block_start = 0
        self.reader: JsonCallReader | None = None
        self.end_matched = 0         # characters of END matched after the object
        self.after = ""              # text after the object, kept in case END does not follow

    def _feed(self, text: str) -> None:
        i, n = 0, len(text)
        while i < n:
            state = self.state
            if state == _TEXT:
                buffer = self.pending + text[i:]
                at = buffer.find(START)
                if at < 0:
                    keep = longest_prefix_suffix(buffer, START)
                    self.content.add(buffer[:len(buffer) - keep])
                    self.pending = buffer[len(buffer) - keep:]
                    return
                self.content.add(buffer[:at])
                self.block_start = self.offset + i - len(self.pending) + at
                i += at + len(START) - len(self.pending)
                self.pending, self.prefix, self.state = "", START, _OPEN
            elif state == _OPEN:
                c = text[i]
                if c in _WS:
                    self.prefix += c
                    i += 1
                elif c == "{":
                    self.reader = JsonCallReader(self, self.block_start)
                    self.state = _CALL
                else:
                    self._give_up(self.prefix)
            elif state == _CALL:
                reader = self.reader
                i = reader.feed(text, i)
                if reader.error is not None:
                    if reader.announced:
                        self.mark_broken()
                        self.state = _PASS
                    else:
                        self._give_up(self.prefix + "".join(reader.pieces))
                elif reader.done:
                    self.state, self.end_matched, self.after = _AFTER, 0, ""
            elif state == _AFTER:
                c = text[i]
                if self.end_matched == 0 and c in _WS:
                    self.after += c
                    i += 1
                elif c == END[self.end_matched]:
                    self.end_matched += 1
                    i += 1
                    if self.end_matched == len(END):
                        self.state = _TEXT
                else:     # text after the call that does not close the block: content from here on
                    self.content.add(self.after + END[:self.end_matched])
                    self.state = _PASS
            else:
                self.content.add(text[i:])
                return

    def _give_up(self, replay: str) -> None:
        """The block is no call after all: its text is content, and so is everything after it."""
        self.content.add(replay)
        self.state = _PASS

    def _finish(self) -> None:
        if self.state == _TEXT:
            self.content.add(self.pending)
        elif self.state == _OPEN:
            self.content.add(self.prefix)
        elif self.state == _CALL:
            self.reader.end_unfinished(self.prefix)


class HermesToolParser(ToolParser):
    name = "hermes"
    keeps_special_tokens = True

    def streamer(self) -> ToolCallStreamer:
        return HermesStreamer()
