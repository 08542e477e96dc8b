"""frontend/chat/tool_parsers: canned model text in each format, whole and streamed split at every character
boundary (a superset of every token boundary) and at the Qwen3 tokenizer's token boundaries; streams must
give the whole result: the same content and calls, each call announced once with its id and whole name,
its argument fragments concatenating to the whole arguments."""

from __future__ import annotations

import json
import re
import time

import pytest

from frontend.chat.tool_parsers import TOOL_PARSERS, get_tool_parser
from frontend.chat.tool_parsers.forced import ArgumentsOnlyToolParser, JsonArrayToolParser
from frontend.chat.tool_parsers.json_scan import MAX_DEPTH, JsonScanner
from tests.conftest import shared_path

WEATHER = '{"city": "東京", "days": [1, 2.5e1, -0], "ok": true, "note": "a \\"quoted\\" 🙂\\u00e9", "x": null}'

# (parser, model text, content, [(name, arguments)])
CASES = [
    ("hermes", 'Sure, checking.\n<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER + '}\n</tool_call>',
     "Sure, checking.", [("get_weather", WEATHER)]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"n": 1}}\n</tool_call>\n<tool_call>\n'
               '{"name": "b", "arguments": {}}\n</tool_call>', None, [("a", '{"n": 1}'), ("b", "{}")]),
    ("hermes", '<tool_call>{"arguments": {"k": [{"z": {}}]}, "name": "late_name"}</tool_call>', None,
     [("late_name", '{"k": [{"z": {}}]}')]),
    ("hermes", '<tool_call>\n{"name": "s", "arguments": "{\\"x\\": 1}"}\n</tool_call>', None, [("s", '{"x": 1}')]),
    ("hermes", '<tool_call>\n{"name": "noargs"}\n</tool_call>\n', None, [("noargs", "{}")]),
    ("hermes", '<tool_call>\n{"name": "open", "arguments": {"a": 1}}', None, [("open", '{"a": 1}')]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nDone: 東京.', "Done: 東京.",
     [("a", "{}")]),
    ("hermes", "No calls, just <tool and </tool_call> and <tool_call", "No calls, just <tool and </tool_call> and "
     "<tool_call", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": ' + WEATHER + '}; {"name": "f", '
     '"arguments": {}}', None, [("get_weather", WEATHER), ("f", "{}")]),
    ("llama3_json", ' \n{"name": "g", "parameters": {"q": "Київ"}}', None, [("g", '{"q": "Київ"}')]),
    ("llama3_json", '{"name": "g", "parameters": {}} trailing words', "trailing words", [("g", "{}")]),
    ("llama3_json", "Hello {\"name\": \"g\"} there", "Hello {\"name\": \"g\"} there", []),
    ("mistral", 'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": ' + WEATHER + '}, '
     '{"name": "g", "arguments": {"q": "日本"}}]', "Let me look.", [("get_weather", WEATHER), ("g", '{"q": "日本"}')]),
    ("mistral", '[TOOL_CALLS] [ {"name": "x", "arguments": {}} ] done', "done", [("x", "{}")]),
    ("pythonic", "[get_weather(city='東京', days=[1, 2], ok=True, x=None), get_time()]", None,
     [("get_weather", '{"city": "東京", "days": [1, 2], "ok": true, "x": null}'), ("get_time", "{}")]),
    ("pythonic", '[f(a="(]\\"", b={"k": (1, 2)})]  ', None, [("f", '{"a": "(]\\"", "b": {"k": [1, 2]}}')]),
    ("pythonic", "Just text [not a call]", "Just text [not a call]", []),
]

# malformed: the text is content, whole or streamed
MALFORMED = [
    ("hermes", "<tool_call>\nnot json\n</tool_call> after"),
    ("hermes", '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "a" "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n["name", "a"]\n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>'),
    ("llama3_json", '{"not": "a call"}'),
    ("llama3_json", "{oops}"),
    ("mistral", "[TOOL_CALLS]garbage"),
    ("mistral", '[TOOL_CALLS][{"name": 1}]'),
    ("pythonic", "[f(1)]"),
    ("pythonic", '[__import__("os").system("echo pwned")]'),
    ("pythonic", "[f(a=g())]"),
    ("pythonic", "[f(a={1, 2})]"),
    ("pythonic", "[f(a=1"),
]


def stream(parser, pieces: list[str]):
    """(content or None, [(name, arguments)], ids, broken) of the text streamed in these pieces, checking the
    delta shape on the way."""
    streamer = parser.streamer()
    content, calls, ids = [], [], []
    for delta in [*map(streamer.feed, pieces), streamer.finish()] if len(pieces) < 100 else \
            _consumed(streamer, pieces):
        content.append(delta.content)
        for call in delta.tool_calls:
            if call.name is not None:
                assert call.index == len(calls) and call.id and call.arguments == ""
                calls.append((call.name, []))
                ids.append(call.id)
            else:
                assert call.id is None and call.index == len(calls) - 1    # fragments of the latest call
                calls[call.index][1].append(call.arguments)
    calls = [(name, "".join(fragments)) for name, fragments in calls]
    return "".join(content) or None, calls, ids, streamer.broken


def _consumed(streamer, pieces):
    """The deltas one at a time (a list of 200,000 deltas would make the test, not the parser, slow)."""
    for piece in pieces:
        yield streamer.feed(piece)
    yield streamer.finish()


def whole(parser, text: str):
    result = parser.extract(text)
    return result.content, [(c.name, c.arguments) for c in result.tool_calls]


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_whole_output(name, text, content, calls):
    assert whole(get_tool_parser(name), text) == (content, calls)
    for _, arguments in calls:
        json.loads(arguments)


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_streamed_at_every_split_equals_whole(name, text, content, calls):
    parser = get_tool_parser(name)
    for k in range(len(text) + 1):
        assert stream(parser, [text[:k], text[k:]])[:2] == (content, calls), k
    for k in range(0, len(text), 7):
        assert stream(parser, [text[:k], text[k:k + 7], text[k + 7:]])[:2] == (content, calls), k
    assert stream(parser, list(text))[:2] == (content, calls)


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(shared_path("models", "tokenizers", "qwen3", "tokenizer.json")))


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_streamed_at_token_boundaries_equals_whole(name, text, content, calls, qwen3_tokenizer):
    offsets = [end for _, end in qwen3_tokenizer.encode(text, add_special_tokens=False).offsets]
    pieces = [text[a:b] for a, b in zip([0, *offsets], offsets)]
    assert "".join(pieces) == text and len(pieces) > 3
    assert stream(get_tool_parser(name), pieces)[:2] == (content, calls)


@pytest.mark.parametrize("name,text", MALFORMED)
def test_malformed_output_is_content(name, text):
    parser = get_tool_parser(name)
    assert whole(parser, text) == (text, [])
    for k in range(len(text) + 1):
        assert stream(parser, [text[:k], text[k:]])[:2] == (text, []), k


def test_several_calls_get_unique_ids_and_mistral_ids_are_nine_alphanumerics():
    text = "".join(f'<tool_call>\n{{"name": "f{i}", "arguments": {{}}}}\n</tool_call>' for i in range(20))
    _, calls, ids, _ = stream(get_tool_parser("hermes"), [text])
    assert len(calls) == 20 and len(set(ids)) == 20 and all(i.startswith("chatcmpl-tool-") for i in ids)
    text = "[TOOL_CALLS][" + ", ".join('{"name": "g", "arguments": {}}' for _ in range(5)) + "]"
    _, calls, ids, _ = stream(get_tool_parser("mistral"), [text])
    assert len(set(ids)) == 5 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)


def test_call_broken_after_its_announcement():
    """A stream cannot take back an announced call whose arguments break (here: cut by max_tokens, and
    invalid JSON); the whole response drops it and returns the text from its block as content."""
    good = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
    for bad in ('<tool_call>\n{"name": "b", "arguments": {"x": [1, ', '<tool_call>\n{"name": "b", "arguments": {"x": ]}}'):
        text = good + bad
        assert whole(get_tool_parser("hermes"), text) == (bad, [("a", "{}")])
        content, calls, _, broken = stream(get_tool_parser("hermes"), list(text))
        assert broken is not None and [c[0] for c in calls] == ["a", "b"]


def test_forced_formats():
    array = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    assert whole(JsonArrayToolParser(), array) == (None, [("a", '{"x": 1}'), ("b", "{}")])
    for k in range(len(array) + 1):
        assert stream(JsonArrayToolParser(), [array[:k], array[k:]])[:2] == (None, [("a", '{"x": 1}'), ("b", "{}")])
    named = ArgumentsOnlyToolParser("get_time")
    text = '{"tz": "UTC", "list": [1, 2]}'
    for k in range(len(text) + 1):
        assert stream(named, [text[:k], text[k:]])[:2] == (None, [("get_time", text)])
    assert whole(named, text) == (None, [("get_time", text)])
    assert whole(named, '{"tz": "UT') == ('{"tz": "UT', [])          # cut short: no call


def test_json_scanner_reports_member_spans_and_where_the_value_ends():
    text = ' {"name": "f", "arguments": {"a": [1, {"b": "}"}]}}  </tool_call>'
    scanner = JsonScanner()
    stop = scanner.feed(text)
    assert scanner.done and text[stop:] == "  </tool_call>"
    a, b = scanner.members["arguments"]
    assert json.loads(text[a:b]) == {"a": [1, {"b": "}"}]}
    for bad in ('{"a": 01}', '{"a": tru}', '{"a": 1,}', '{"a" 1}', '{"a": "\x01"}', '{"a": "\\x"}'):
        scanner = JsonScanner()
        scanner.feed(bad)
        assert scanner.error is not None and not scanner.done, bad


def test_hostile_inputs_stay_linear_and_bounded():
    """Deep nesting stops at MAX_DEPTH; a 60 KB argument streamed one character at a time is read in one
    pass (re-parsing the partial JSON at every delta would take minutes)."""
    deep = '<tool_call>\n{"name": "f", "arguments": ' + "[" * 100_000
    assert stream(get_tool_parser("hermes"), [deep])[:2] == (deep, []) and MAX_DEPTH < 100_000
    big = '<tool_call>\n{"name": "f", "arguments": {"text": "' + "x\\n" * 20_000 + '"}}\n</tool_call>'
    start = time.perf_counter()
    _, calls, _, _ = stream(get_tool_parser("hermes"), list(big))
    assert calls[0][0] == "f" and len(calls[0][1]) == len('{"text": ""}') + 3 * 20_000
    assert time.perf_counter() - start < 15      # ~1 s here; quadratic: ~30 s
    many = "<tool_call>" * 20_000
    assert whole(get_tool_parser("hermes"), many)[0] == many


def test_every_parser_is_registered():
    assert sorted(TOOL_PARSERS) == ["hermes", "llama3_json", "mistral", "pythonic"]
    with pytest.raises(ValueError, match="unknown tool call parser"):
        get_tool_parser("nope")
