"""pythonic: Llama 3.2/4 and ToolACE style, the whole output is `[f(a=1, b="x"), g()]`.

Each call is read up to its closing parenthesis (tracking brackets and string literals), then parsed with
Python's `ast` and its keyword values read with `ast.literal_eval`, which accepts literals only: model
text is never evaluated (vLLM's CVE-2025-9141 was an `eval` in a tool parser). A call is announced when
it is complete, with its arguments as JSON in the delta that follows. An output that does not start with
`[` is content.
"""

from __future__ import annotations

import ast
import json
import re

from frontend.chat.tool_parsers.base import CALL, ToolCallStreamer, ToolParser

MAX_CALL_CHARS = 1 << 20
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_OPENERS, _CLOSERS = "([{", ")]}"
_START, _ITEM, _NEXT, _AFTER = range(4)


def parse_call(text: str) -> tuple[str, str] | None:
    """(name, arguments as JSON) of one `name(k=literal, ...)`, or None when it is not such a call."""
    try:
        node = ast.parse(text, mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
                and all(k.arg is not None for k in node.keywords)):
            return None
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        return node.func.id, json.dumps(arguments, ensure_ascii=False)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


class PythonicStreamer(ToolCallStreamer):
    """`held`: list syntax and whitespace not yet known to belong to calls."""

    def __init__(self) -> None:
        super().__init__()
        self.call: list[str] = []    # the current call's text
        self.call_chars = 0
        self.block_start = 0
        self.depth = 0
        self.quote = ""              # the open string literal's quote character
        self.escape = False

    def _step(self, text: str, i: int) -> int:
        state = self.state
        if state == CALL:
            return self._read_call(text, i)
        c = text[i]
        if state == _ITEM and (c.isalpha() or c == "_"):
            self.block_start = self.offset + i - len(self.held)
            self.call, self.call_chars, self.depth, self.quote = [], 0, 0, ""
            self.state = CALL
            return i
        if state == _NEXT and c == "]":
            self.held, self.state = "", _AFTER
            return i + 1
        return self.list_syntax(c, i, _START, _ITEM, _NEXT)

    def _read_call(self, text: str, i: int) -> int:
        """Read the call up to its closing parenthesis; then parse and announce it."""
        start, n = i, len(text)
        closed = False
        while i < n:
            c = text[i]
            i += 1
            if self.quote:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == self.quote:
                    self.quote = ""
            elif c in "\"'":
                self.quote = c
            elif c in _OPENERS:
                self.depth += 1
            elif c in _CLOSERS:
                self.depth -= 1
                if self.depth <= 0:
                    closed = True
                    break
        self.call.append(text[start:i])
        self.call_chars += i - start
        if not closed and self.call_chars <= MAX_CALL_CHARS:
            return i
        call_text = "".join(self.call)
        parsed = parse_call(call_text) if self.depth == 0 and call_text.endswith(")") else None
        if parsed is None:
            self.give_up(self.held + call_text)
            return i
        index = self.announce(parsed[0], self.block_start)
        self.arguments(index, parsed[1])
        self.held, self.state = "", _NEXT
        return i

    def _finish(self) -> None:
        if self.state == CALL:
            self.content.add(self.held + "".join(self.call))
        else:
            super()._finish()


class PythonicToolParser(ToolParser):
    name = "pythonic"
    streamer_class = PythonicStreamer
