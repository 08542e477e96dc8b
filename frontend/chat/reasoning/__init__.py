"""Reasoning parsers: split a thinking model's output into `reasoning` and `content`."""

from frontend.chat.reasoning.base import ReasoningDelta, ReasoningParser, ReasoningStreamer
from frontend.chat.reasoning.parsers import REASONING_PARSERS, get_reasoning_parser

__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser", "ReasoningStreamer", "get_reasoning_parser"]
