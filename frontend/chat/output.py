"""One chat choice's output on its way to the client: reasoning split off first (--reasoning-parser), then
tool calls parsed out of the content (the request's ToolPlan), as typed parts or as one message.

A streamed choice is read by a ChatOutputParser, whose parts (content, reasoning, tool-call deltas) each API
writes in its own shape: OpenAI chat as `content` / `reasoning` / `tool_calls` deltas, Anthropic as content
blocks, the Responses API as output items (`turn_events` gives the last two one vocabulary). A whole
OpenAI response is read by `parse_message`, which runs the same streamers over the whole text, so a stream
and a whole response carry the same reasoning, content and calls. Policies, as vLLM's: finish_reason is
"tool_calls" when `auto` found calls, while `required` and named calls keep the engine's reason; a forced
output holds no content (the grammar allows none; a call cut short by max_tokens is dropped, not shown as
text); `parallel_tool_calls: false` keeps only the first call; `include_reasoning: false` drops the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from frontend.chat.reasoning import ReasoningParser, ReasoningStreamer
from frontend.chat.tool_choice import ToolPlan
from frontend.chat.tool_parsers import ToolCallDelta, ToolCallStreamer

REASONING_FIELDS = {"reasoning": ("reasoning",), "reasoning_content": ("reasoning_content",),
                    "both": ("reasoning", "reasoning_content")}
CONTENT, REASONING, TOOL_CALL = "content", "reasoning", "tool_call"
TOOL_ARGS = "tool_args"      # a turn event (turn_events): a fragment of the current call's JSON arguments


class Part(NamedTuple):
    """One piece of a choice's read output: content or reasoning text, or one tool-call delta."""

    kind: str                            # CONTENT | REASONING | TOOL_CALL
    text: str = ""
    call: ToolCallDelta | None = None    # TOOL_CALL: a call's announcement (index, id, name) or arguments


@dataclass(frozen=True, slots=True)
class ChatOutputOptions:
    """What shapes a request's output (shared by its choices)."""

    reasoning_parser: ReasoningParser | None
    reasoning_state: int                     # the reasoning streamer's initial state, from the prompt
    tool_plan: ToolPlan | None
    include_reasoning: bool = True

    @property
    def active(self) -> bool:
        return self.reasoning_parser is not None or self.tool_plan is not None


class ChatOutputParser:
    """One choice's streamers; `feed` and `finish` return the parts its text makes, in order."""

    __slots__ = ("options", "reasoning", "tools", "calls_found")

    def __init__(self, options: ChatOutputOptions):
        self.options = options
        parser = options.reasoning_parser
        self.reasoning: ReasoningStreamer | None = (
            ReasoningStreamer(parser, options.reasoning_state) if parser is not None else None)
        plan = options.tool_plan
        self.tools: ToolCallStreamer | None = plan.parser.streamer() if plan and plan.parser else None
        self.calls_found = 0

    def feed(self, text: str) -> list[Part]:
        if not text:
            return []
        if self.reasoning is None:
            return self._content(text, final=False)
        split = self.reasoning.feed(text)
        return self._reasoning(split.reasoning) + self._content(split.content, final=False)

    def finish(self) -> list[Part]:
        if self.reasoning is None:
            return self._content("", final=True)
        split = self.reasoning.finish()
        return self._reasoning(split.reasoning) + self._content(split.content, final=True)

    def finish_reason(self, engine_reason: str) -> str:
        plan = self.options.tool_plan
        if plan is not None and plan.mode == "auto" and self.calls_found:
            return "tool_calls"
        return engine_reason

    def _reasoning(self, text: str) -> list[Part]:
        if not text or not self.options.include_reasoning:
            return []
        return [Part(REASONING, text)]

    def _content(self, text: str, final: bool) -> list[Part]:
        if self.tools is None:
            return [Part(CONTENT, text)] if text else []
        parsed = self.tools.feed(text) if text else None
        out = []
        for piece in (parsed, self.tools.finish() if final else None):
            if piece is None:
                continue
            if piece.content and not self.options.tool_plan.forced:
                out.append(Part(CONTENT, piece.content))
            for call in piece.tool_calls:
                if call.index > 0 and not self.options.tool_plan.parallel_tool_calls:
                    continue
                if call.name is not None:
                    self.calls_found += 1
                out.append(Part(TOOL_CALL, call=call))
        return out


def turn_events(text: str, parts: list[Part] | None) -> list[tuple[str, str]]:
    """One step's output as the agent APIs' events: (CONTENT or REASONING, text), (TOOL_CALL, the tool's
    name) when a call starts, (TOOL_ARGS, a fragment of its arguments). Without a parser it is all content."""
    if parts is None:
        return [(CONTENT, text)] if text else []
    events = []
    for part in parts:
        if part.kind != TOOL_CALL:
            events.append((part.kind, part.text))
            continue
        if part.call.name is not None:
            events.append((TOOL_CALL, part.call.name))
        if part.call.arguments:
            events.append((TOOL_ARGS, part.call.arguments))
    return events


def parse_message(options: ChatOutputOptions, text: str,
                  reasoning_fields: tuple[str, ...] = ("reasoning",)) -> tuple[dict, bool]:
    """A whole output as OpenAI message fields (reasoning, content, tool_calls), and whether it holds calls."""
    parser = options.reasoning_parser
    reasoning, content = (parser.extract_from_state(text, options.reasoning_state) if parser is not None
                          else (None, text))
    message: dict = {"role": "assistant", "content": content}
    if reasoning is not None and options.include_reasoning:
        for name in reasoning_fields:
            message[name] = reasoning
    plan = options.tool_plan
    if plan is None:
        return message, False
    calls = []
    if plan.parser is not None:
        extracted = plan.parser.extract(content or "")
        calls = extracted.tool_calls if plan.parallel_tool_calls else extracted.tool_calls[:1]
        message["content"] = "" if plan.forced else extracted.content
    message["tool_calls"] = [call.to_openai() for call in calls]
    return message, bool(calls)
