"""Tool-call parsers by --tool-call-parser name (vLLM's names): each reads one model family's call format,
from a whole output (`extract`) or as it streams (`streamer`)."""

from __future__ import annotations

from frontend.chat.tool_parsers.base import (
    ExtractedToolCalls,
    ParsedDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStreamer,
    ToolParser,
    make_tool_call_id,
)
from frontend.chat.tool_parsers.hermes import HermesToolParser
from frontend.chat.tool_parsers.llama3_json import Llama3JsonToolParser
from frontend.chat.tool_parsers.mistral import MistralToolParser
from frontend.chat.tool_parsers.pythonic import PythonicToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser)
}

__all__ = ["TOOL_PARSERS", "ExtractedToolCalls", "ParsedDelta", "ToolCall", "ToolCallDelta", "ToolCallStreamer",
           "ToolParser", "get_tool_parser", "make_tool_call_id"]


def get_tool_parser(name: str) -> ToolParser:
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}") from None
