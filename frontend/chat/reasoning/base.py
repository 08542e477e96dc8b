"""Splitting a reasoning model's output into `reasoning` and `content` at its think markers.

One streamer serves both modes (`extract` runs it over the whole text), so a streamed response and a whole
one split identically. The initial state comes from the rendered prompt, the same one the chat template
kwargs produced: a prompt that ends inside an open `<think>` (Qwen3-2507, DeepSeek-R1) starts the output in
reasoning; one that ends with a closed block (Qwen3 with `enable_thinking: false`) starts it in content.
Whitespace right after the end marker is dropped; everything else is kept as written.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontend.chat.tool_parsers.base import longest_prefix_suffix

_WS = " \t\n\r"
_MAX_LEAD = 256          # whitespace awaited before the start marker, at most
START, REASONING, AFTER_END, CONTENT = range(4)


@dataclass(slots=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningStreamer:
    __slots__ = ("parser", "state", "pending")

    def __init__(self, parser: ReasoningParser, state: int):
        self.parser = parser
        self.state = state
        self.pending = ""

    @property
    def in_reasoning(self) -> bool:
        return self.state in (START, REASONING)

    def feed(self, text: str) -> ReasoningDelta:
        out = ReasoningDelta()
        parser = self.parser
        while text:
            state = self.state
            if state == START:
                buffer = (self.pending + text).lstrip(_WS)
                if buffer.startswith(parser.start_token):
                    self.pending, self.state = "", REASONING
                    text = buffer[len(parser.start_token):]
                elif parser.start_token.startswith(buffer) and len(self.pending) < _MAX_LEAD:
                    self.pending += text            # may still become the start marker
                    return out
                else:
                    text, self.pending = self.pending + text, ""
                    self.state = REASONING if parser.reasoning_without_start else CONTENT
            elif state == REASONING:
                buffer = self.pending + text
                at = buffer.find(parser.end_token)
                if at < 0:
                    keep = longest_prefix_suffix(buffer, parser.end_token)
                    out.reasoning += buffer[:len(buffer) - keep]
                    self.pending = buffer[len(buffer) - keep:]
                    return out
                out.reasoning += buffer[:at]
                text, self.pending, self.state = buffer[at + len(parser.end_token):], "", AFTER_END
            elif state == AFTER_END:
                text = text.lstrip(_WS)
                if text:
                    self.state = CONTENT
            else:
                out.content += text
                return out
        return out

    def finish(self) -> ReasoningDelta:
        pending, self.pending = self.pending, ""
        if self.state == START:
            return ReasoningDelta(reasoning=pending) if self.parser.reasoning_without_start else \
                ReasoningDelta(content=pending)
        if self.state == REASONING:
            return ReasoningDelta(reasoning=pending)
        return ReasoningDelta()


class ReasoningParser:
    """A reasoning format by --reasoning-parser name."""

    name = ""
    start_token = "<think>"
    end_token = "</think>"
    reasoning_without_start = False     # an output without the start marker is reasoning until the end one

    def initial_state(self, prompt: str) -> int:
        tail = prompt.rstrip(_WS)
        if tail.endswith(self.start_token):
            return REASONING
        if tail.endswith(self.end_token):
            return CONTENT
        return START

    def streamer(self, prompt: str) -> ReasoningStreamer:
        return ReasoningStreamer(self, self.initial_state(prompt))

    def reasoning_ended_in_prompt(self, prompt: str) -> bool:
        return self.initial_state(prompt) == CONTENT

    def extract(self, text: str, prompt: str = "") -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output; None for an empty part."""
        return self.extract_from_state(text, self.initial_state(prompt))

    def extract_from_state(self, text: str, state: int) -> tuple[str | None, str | None]:
        streamer = ReasoningStreamer(self, state)
        first, last = streamer.feed(text), streamer.finish()
        reasoning = first.reasoning + last.reasoning
        content = first.content + last.content
        return reasoning or None, content or None
