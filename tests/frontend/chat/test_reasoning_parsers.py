"""frontend/chat/reasoning: `<think>` reasoning split from content, whole and streamed at every character
boundary, with the initial state taken from the rendered prompt."""

from __future__ import annotations

import pytest

from frontend.chat.reasoning import get_reasoning_parser

THOUGHT = "<think>\nThe user wants 東京 🙂; a < b.\n</think>\n\nIt is sunny."
CLOSED_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"     # Qwen3, enable_thinking: false
OPEN_PROMPT = "<|im_start|>assistant\n<think>\n"                      # templates that open the block

# (parser, prompt, output, reasoning, content)
CASES = [
    ("qwen3", "", THOUGHT, "\nThe user wants 東京 🙂; a < b.\n", "It is sunny."),
    ("qwen3", "", "No thinking at all.", None, "No thinking at all."),
    ("qwen3", "", "  <think>cut off by max_tokens", "cut off by max_tokens", None),
    ("qwen3", "", "<think></think>", None, None),
    ("qwen3", "", "<thin", None, "<thin"),
    ("qwen3", CLOSED_PROMPT, "<think>literal</think> text", None, "<think>literal</think> text"),
    ("qwen3", OPEN_PROMPT, "plan</think>\n\nanswer", "plan", "answer"),
    ("deepseek_r1", "", "reasoning without a start tag</think>answer", "reasoning without a start tag", "answer"),
    ("deepseek_r1", "", THOUGHT, "\nThe user wants 東京 🙂; a < b.\n", "It is sunny."),
    ("deepseek_r1", "", "all reasoning, never closed", "all reasoning, never closed", None),
    ("deepseek_r1", CLOSED_PROMPT, "content only", None, "content only"),
]


@pytest.mark.parametrize("name,prompt,text,reasoning,content", CASES)
def test_whole_and_streamed_at_every_split(name, prompt, text, reasoning, content):
    parser = get_reasoning_parser(name)
    assert parser.extract(text, prompt) == (reasoning, content)
    for k in range(len(text) + 1):
        streamer = parser.streamer(prompt)
        deltas = [streamer.feed(text[:k]), streamer.feed(text[k:]), streamer.finish()]
        got = ("".join(d.reasoning for d in deltas) or None, "".join(d.content for d in deltas) or None)
        assert got == (reasoning, content), k


def test_reasoning_streams_before_the_end_marker_arrives():
    streamer = get_reasoning_parser("qwen3").streamer("")
    assert streamer.feed("<think>step one, ").reasoning == "step one, "
    assert streamer.feed("step two</th").reasoning == "step two"       # "</th" held: it may be the marker
    delta = streamer.feed("ink>\n\nDone")
    assert (delta.reasoning, delta.content) == ("", "Done")


def test_unknown_parser():
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        get_reasoning_parser("nope")
