"""One chat choice's output on its way to the client: reasoning split off first (--reasoning-parser), then
tool calls parsed out of the content (the request's ToolPlan), as stream deltas or as one message.

Both modes run the same streamers (a whole output is one piece), so a stream and a whole response carry
the same reasoning, content and calls. Policies, as vLLM's: finish_reason is "tool_calls" when `auto`
found calls, while `required` and named calls keep the engine's reason; a forced output holds no content
(the grammar allows none; a call cut short by max_tokens is dropped, not shown as text);
`parallel_tool_calls: false` keeps only the first call; `include_reasoning: false` drops the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontend.chat.reasoning import ReasoningParser, ReasoningStreamer
from frontend.chat.tool_choice import ToolPlan
from frontend.chat.tool_parsers import ToolCallStreamer

REASONING_FIELDS = {"reasoning": ("reasoning",), "reasoning_content": ("reasoning_content",),
                    "both": ("reasoning", "reasoning_content")}


@dataclass(frozen=True, slots=True)
class ChatOutputOptions:
    """What shapes a request's output (shared by its choices)."""

    reasoning_parser: ReasoningParser | None
    reasoning_state: int                     # the reasoning streamer's initial state, from the prompt
    tool_plan: ToolPlan | None
    include_reasoning: bool = True
    reasoning_fields: tuple[str, ...] = ("reasoning",)

    @property
    def active(self) -> bool:
        return self.reasoning_parser is not None or self.tool_plan is not None


class ChatOutputParser:
    """One choice's streamers; `feed` and `finish` return the deltas (dicts) to send, in order."""

    __slots__ = ("options", "reasoning", "tools", "calls_found")

    def __init__(self, options: ChatOutputOptions):
        self.options = options
        parser = options.reasoning_parser
        self.reasoning: ReasoningStreamer | None = (
            ReasoningStreamer(parser, options.reasoning_state) if parser is not None else None)
        plan = options.tool_plan
        self.tools: ToolCallStreamer | None = plan.parser.streamer() if plan and plan.parser else None
        self.calls_found = 0

    def feed(self, text: str) -> list[dict]:
        if not text:
            return []
        if self.reasoning is None:
            return self._content(text, final=False)
        split = self.reasoning.feed(text)
        return self._reasoning(split.reasoning) + self._content(split.content, final=False)

    def finish(self) -> list[dict]:
        if self.reasoning is None:
            return self._content("", final=True)
        split = self.reasoning.finish()
        return self._reasoning(split.reasoning) + self._content(split.content, final=True)

    def finish_reason(self, engine_reason: str) -> str:
        plan = self.options.tool_plan
        if plan is not None and plan.mode == "auto" and self.calls_found:
            return "tool_calls"
        return engine_reason

    def _reasoning(self, text: str) -> list[dict]:
        if not text or not self.options.include_reasoning:
            return []
        return [dict.fromkeys(self.options.reasoning_fields, text)]

    def _content(self, text: str, final: bool) -> list[dict]:
        if self.tools is None:
            return [{"content": text}] if text else []
        parsed = self.tools.feed(text) if text else None
        out = []
        for piece in (parsed, self.tools.finish() if final else None):
            if piece is None:
                continue
            if piece.content and not self.options.tool_plan.forced:
                out.append({"content": piece.content})
            for call in piece.tool_calls:
                if call.index > 0 and not self.options.tool_plan.parallel_tool_calls:
                    continue
                if call.name is not None:
                    self.calls_found += 1
                out.append({"tool_calls": [call.to_openai()]})
        return out


def parse_message(options: ChatOutputOptions, text: str) -> tuple[dict, bool]:
    """A whole output as message fields (reasoning, content, tool_calls), and whether it holds calls."""
    parser = options.reasoning_parser
    reasoning, content = (parser.extract_from_state(text, options.reasoning_state) if parser is not None
                          else (None, text))
    message: dict = {"role": "assistant", "content": content}
    if reasoning is not None and options.include_reasoning:
        for name in options.reasoning_fields:
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
