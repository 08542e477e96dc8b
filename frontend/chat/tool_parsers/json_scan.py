"""An incremental, character-level JSON validator for one value, which records where the members of a
top-level object lie.

Tool-call parsers feed model text to it as it streams: it consumes each character once (O(text) per
request, where re-parsing the partial JSON at every delta would be O(text²)), stops exactly where the value
ends so the caller can read what follows (`\\n</tool_call>`, `; `, `]`), and knows, for each depth-1 member
of an object, the span of its value. That is what lets a parser forward the raw `"arguments"` text as it
arrives and still know, at the end, that it was valid JSON.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 128

_WS = frozenset(" \t\n\r")
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("+-0123456789.eE")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# states
_VALUE, _STRING, _NUMBER_STATE, _LITERAL, _AFTER_VALUE, _KEY, _COLON, _DONE, _ERROR = range(9)


class JsonScanner:
    """Validates one JSON value fed in pieces. `feed(text, start)` consumes text[start:] up to the end of
    the value and returns where it stopped; `done` / `error` say how it ended.

    For a top-level object, `members` maps each depth-1 key to the (start, end) offsets of its value and
    `open_member` is the (key, start) of the member whose value is being read; offsets count every character
    fed since the scanner was made (leading whitespace included)."""

    __slots__ = ("pos", "stack", "state", "error", "done", "members", "open_member", "_key", "_collect_key",
                 "_escape", "_literal", "_number", "_in_key", "_expect_member", "_member_key", "_key_done",
                 "_base")

    def __init__(self) -> None:
        self.pos = 0                    # characters consumed so far
        self.stack: list[str] = []
        self.state = _VALUE
        self.error: str | None = None
        self.done = False
        self.members: dict[str, tuple[int, int]] = {}
        self.open_member: tuple[str, int] | None = None
        self._key: list[str] = []
        self._collect_key = False
        self._escape = 0                # 0: none; 1: after a backslash; 2-5: hex digits of \\uXXXX still due
        self._literal = ""              # what a true/false/null still needs
        self._number: list[str] = []
        self._in_key = False
        self._expect_member = False     # just after '{' or '[': the container may close at once
        self._member_key = ""           # the depth-1 key just read
        self._key_done = False
        self._base = 0                  # absolute offset of index 0 of the piece being fed

    @property
    def past_member(self) -> bool:
        """The last depth-1 member is followed by its ',' or the closing '}' (so it is surely complete)."""
        return self.done or not (len(self.stack) == 1 and self.state == _AFTER_VALUE)

    def feed(self, text: str, start: int = 0) -> int:
        i, n = start, len(text)
        self._base = self.pos - start
        while i < n and self.state < _DONE:
            state = self.state
            c = text[i]
            if state == _STRING:
                if self._escape:
                    i = self._escaped(c, i)
                    continue
                match = _STRING_RUN.match(text, i)
                if match:
                    if self._collect_key:
                        self._key.append(match.group())
                    i = match.end()
                    continue
                if c == '"':
                    i += 1
                    self._string_done(i)
                elif c == "\\":
                    if self._collect_key:
                        self._key.append(c)
                    self._escape = 1
                    i += 1
                else:
                    self._fail(i, "no control character inside a string")
                continue
            if state == _NUMBER_STATE:
                if c in _NUMBER_CHARS:
                    self._number.append(c)
                    i += 1
                    continue
                if not _NUMBER.fullmatch("".join(self._number)):
                    self._fail(i, "a well-formed number")
                    continue
                self._value_done(i)
                continue        # the terminator is read in the next state
            if state == _LITERAL:
                if c != self._literal[0]:
                    self._fail(i, "true, false or null")
                    continue
                self._literal = self._literal[1:]
                i += 1
                if not self._literal:
                    self._value_done(i)
                continue
            if c in _WS:
                i += 1
                continue
            if state == _VALUE:
                i = self._value(c, i)
            elif state == _AFTER_VALUE:
                i = self._after_value(c, i)
            elif state == _KEY:
                if c == '"':
                    self._in_key = True
                    self._collect_key = len(self.stack) == 1
                    self._key = []
                    self.state = _STRING
                    i += 1
                elif c == "}" and self._expect_member:
                    i = self._close(c, i)
                else:
                    self._fail(i, "an object key")
            elif state == _COLON:
                if c == ":":
                    self.state = _VALUE
                    i += 1
                else:
                    self._fail(i, "':' after an object key")
        self.pos = self._base + i
        return i

    def finish_number(self) -> None:
        """At the end of the text: a top-level number ends there."""
        if self.state == _NUMBER_STATE and not self.stack and _NUMBER.fullmatch("".join(self._number)):
            self.state, self.done = _DONE, True

    # ------------------------------------------------------------------ the grammar, one character at a time
    def _value(self, c: str, i: int) -> int:
        if len(self.stack) == 1 and self.stack[0] == "{" and self._key_done:
            self.open_member = (self._member_key, self._base + i)
            self._key_done = False
        if c == "{" or c == "[":
            if len(self.stack) >= MAX_DEPTH:
                self._fail(i, f"JSON nested deeper than {MAX_DEPTH}")
                return i
            self.stack.append(c)
            if c == "{":
                self.state, self._expect_member = _KEY, True
            else:
                self.state = _VALUE
                self._expect_member = True        # ']' may close an empty array
            return i + 1
        if c == "]" and self._expect_member and self.stack and self.stack[-1] == "[":
            return self._close(c, i)
        self._expect_member = False
        if c == '"':
            self._in_key = False
            self._collect_key = False
            self.state = _STRING
            return i + 1
        if c == "-" or c.isdigit():
            self._number = [c]
            self.state = _NUMBER_STATE
            return i + 1
        literal = _LITERALS.get(c)
        if literal:
            self._literal = literal[1:]
            self.state = _LITERAL
            return i + 1
        self._fail(i, "a JSON value")
        return i

    def _after_value(self, c: str, i: int) -> int:
        top = self.stack[-1]
        if c == ",":
            self._expect_member = False
            self.state = _KEY if top == "{" else _VALUE
            return i + 1
        if (c == "}" and top == "{") or (c == "]" and top == "["):
            return self._close(c, i)
        self._fail(i, "',' or the end of the container")
        return i

    def _close(self, c: str, i: int) -> int:
        self.stack.pop()
        self._expect_member = False
        self._value_done(i + 1)
        return i + 1

    def _escaped(self, c: str, i: int) -> int:
        if self._escape == 1:
            if c not in _ESCAPES:
                self._fail(i, "a valid escape")
                return i
            self._escape = 2 if c == "u" else 0
        else:
            if c not in _HEX:
                self._fail(i, "four hex digits after \\u")
                return i
            self._escape = 0 if self._escape == 5 else self._escape + 1
        if self._collect_key:
            self._key.append(c)
        return i + 1

    def _string_done(self, i: int) -> None:
        if self._in_key:
            self._in_key = False
            self.state = _COLON
            if self._collect_key:
                self._collect_key = False
                self._member_key = _decode_key("".join(self._key))
                self._key_done = True
            return
        self._value_done(i)

    def _value_done(self, i: int) -> None:
        """A value ended just before text index i (of the current feed)."""
        end = self._base + i
        if not self.stack:
            self.state, self.done = _DONE, True
            return
        self.state = _AFTER_VALUE
        if len(self.stack) == 1 and self.stack[0] == "{" and self.open_member is not None:
            key, begin = self.open_member
            self.members[key] = (begin, end)
            self.open_member = None
            self._key_done = False

    def _fail(self, i: int, expected: str) -> None:
        self.state = _ERROR
        self.error = f"invalid JSON at offset {self._base + i}: expected {expected}"



def _decode_key(raw: str) -> str:
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw
