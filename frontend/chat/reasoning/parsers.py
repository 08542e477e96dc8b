"""The reasoning formats by name (vLLM's --reasoning-parser names)."""

from __future__ import annotations

from frontend.chat.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3: `<think>…</think>` opens the output; without `<think>` the output is content (unless the
    prompt opened the block, as the 2507 templates do)."""

    name = "qwen3"


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1 (and QwQ): the template opens `<think>` in the prompt, so the output is reasoning until
    `</think>`, with or without a `<think>` of its own."""

    name = "deepseek_r1"
    reasoning_without_start = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    parser.name: parser for parser in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser)
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    try:
        return REASONING_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}") \
            from None
