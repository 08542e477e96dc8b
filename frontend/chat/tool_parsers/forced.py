"""How forced calls are read in the formats without a native one (vLLM's older JSON forms): `required`
writes `[{"name": N, "parameters": {...}}, ...]`, a named function writes its arguments object alone."""

from __future__ import annotations

from frontend.chat.tool_parsers.base import ToolCallStreamer, ToolParser, make_tool_call_id
from frontend.chat.tool_parsers.json_scan import JsonScanner
from frontend.chat.tool_parsers.mistral import MistralStreamer

_WS = " \t\n\r"


class JsonArrayToolParser(ToolParser):
    name = "json_array"

    def streamer(self) -> ToolCallStreamer:
        return MistralStreamer(marker="", new_id=make_tool_call_id)


class ArgumentsOnlyStreamer(ToolCallStreamer):
    """The whole output is the named function's arguments: announced at its first character, forwarded
    as it comes, and checked to be one complete JSON value at the end."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.index: int | None = None
        self.scanner = JsonScanner()

    def _feed(self, text: str) -> int:
        n = len(text)
        if self.index is None:
            text = text.lstrip(_WS)
            if not text:
                return n
            self.index = self.announce(self.name, self.offset)
        stop = self.scanner.feed(text)
        if self.scanner.error is not None or stop < len(text.rstrip(_WS)):
            self.mark_broken()
        self.arguments(self.index, text)
        return n

    def _finish(self) -> None:
        self.scanner.finish_number()
        if self.index is not None and not self.scanner.done:
            self.mark_broken()


class ArgumentsOnlyToolParser(ToolParser):
    name = "arguments"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def streamer(self) -> ToolCallStreamer:
        return ArgumentsOnlyStreamer(self.function_name)
