"""End to end: tool calls and reasoning through the real server (demo model: random weights, byte-level
tokenizer), with the output forced by grammars. `required` and named calls, in hermes' format and in vLLM's
JSON forms (no parser), validate against the tool's parameters, with unique ids and the stream equal to
the whole response; `auto` reads a hermes block forced by a regex; a forced `<think>…</think>` output
splits into reasoning and content, in the message and in the deltas."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.server import ServerProcess

TIME = {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"],
        "additionalProperties": False}
SWITCH = {"type": "object", "properties": {"on": {"type": "boolean"}, "level": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 9}},
          "required": ["on", "level"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}},
         {"type": "function", "function": {"name": "set_switch", "parameters": SWITCH}}]
PARAMETERS = {"get_time": TIME, "set_switch": SWITCH}
USER = [{"role": "user", "content": "What time is it?"}]
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}   # bounded whitespace for random weights
HERMES_CALL = r'<tool_call>\n\{"name": "get_time", "arguments": \{"tz": "(UTC|CET)"\}\}\n</tool_call>'


def start(*flags: str) -> ServerProcess:
    return ServerProcess("ringserve-demo", "--max-model-len", "1024", *flags)


@pytest.fixture(scope="module")
def hermes():
    with start("--enable-auto-tool-choice", "--tool-call-parser", "hermes") as server:
        yield server, openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def plain():
    with start() as server:
        yield server, openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def whole(result) -> dict:
    choice = result.choices[0]
    calls = choice.message.tool_calls or []
    return {"content": choice.message.content or None, "calls": [(c.function.name, c.function.arguments)
                                                                 for c in calls],
            "ids": [c.id for c in calls], "finish_reason": choice.finish_reason,
            "reasoning": getattr(choice.message, "reasoning", None)}


def streamed(chunks) -> dict:
    content, reasoning, calls, finishes = [], [], {}, []
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content.append(choice.delta.content or "")
        reasoning.append(getattr(choice.delta, "reasoning", None) or "")
        for call in choice.delta.tool_calls or ():
            if call.index not in calls:
                assert call.id and call.type == "function" and call.function.name
                calls[call.index] = [call.function.name, [call.function.arguments or ""], call.id]
            else:
                assert call.id is None and call.function.name is None
                calls[call.index][1].append(call.function.arguments)
        if choice.finish_reason is not None:
            finishes.append(choice.finish_reason)
    assert len(finishes) == 1
    ordered = [calls[i] for i in sorted(calls)]
    return {"content": "".join(content) or None, "calls": [(name, "".join(args)) for name, args, _ in ordered],
            "ids": [i for _, _, i in ordered], "finish_reason": finishes[0], "reasoning": "".join(reasoning) or None}


def same_but_ids(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "ids"} == {k: v for k, v in b.items() if k != "ids"}


def run_both(client, **kwargs) -> dict:
    result = whole(client.chat.completions.create(model="ringserve-demo", messages=USER, **kwargs))
    stream = streamed(list(client.chat.completions.create(model="ringserve-demo", messages=USER, stream=True,
                                                          **kwargs)))
    assert same_but_ids(result, stream), (result, stream)
    assert not set(result["ids"]) & set(stream["ids"])
    return result


def check_calls(result: dict, allowed: set[str]) -> None:
    for name, arguments in result["calls"]:
        assert name in allowed
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])
    assert len(set(result["ids"])) == len(result["ids"])


@pytest.mark.parametrize("server", ["hermes", "plain"])
def test_required_calls_validate_and_stream_equals_whole(server, request):
    _, client = request.getfixturevalue(server)
    for seed in range(2):
        # one call of bounded arguments with bounded whitespace: the grammar ends well within max_tokens
        result = run_both(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                          seed=seed, max_tokens=200, extra_body=COMPACT)
        assert result["content"] is None
        assert result["finish_reason"] == "stop"         # the policy for forced calls: not "tool_calls"
        assert len(result["calls"]) == 1
        check_calls(result, {"get_time", "set_switch"})


@pytest.mark.parametrize("server", ["hermes", "plain"])
def test_named_call_validates(server, request):
    _, client = request.getfixturevalue(server)
    named = {"type": "function", "function": {"name": "set_switch"}}
    for seed in (3,):
        result = run_both(client, tools=TOOLS, tool_choice=named, temperature=1.0, seed=seed, max_tokens=200,
                          extra_body=COMPACT)
        assert result["finish_reason"] == "stop"
        assert [name for name, _ in result["calls"]] == ["set_switch"]
        check_calls(result, {"set_switch"})


def test_parallel_required_calls_all_validate(hermes):
    _, client = hermes
    result = run_both(client, tools=TOOLS, tool_choice="required", temperature=1.0, seed=5, max_tokens=400,
                      extra_body=COMPACT)
    assert result["calls"]
    check_calls(result, {"get_time", "set_switch"})


def test_one_token_of_a_forced_call_is_length_without_calls(hermes):
    _, client = hermes
    result = run_both(client, tools=TOOLS, tool_choice="required", max_completion_tokens=1)
    assert result["finish_reason"] == "length" and result["calls"] == [] and result["content"] is None


def test_auto_reads_a_hermes_block_forced_by_a_regex(hermes):
    _, client = hermes
    result = run_both(client, tools=TOOLS, temperature=0, max_tokens=200,
                      extra_body={"structured_outputs": {"regex": "[a-z]{1,8}\n" + HERMES_CALL}})
    assert result["finish_reason"] == "tool_calls" and result["content"]
    assert [name for name, _ in result["calls"]] == ["get_time"]
    check_calls(result, {"get_time"})
    plain_text = run_both(client, tools=TOOLS, temperature=0, max_tokens=50,
                          extra_body={"structured_outputs": {"regex": "[a-z ]{1,20}"}})
    assert plain_text["calls"] == [] and plain_text["finish_reason"] == "stop" and plain_text["content"]


def test_forced_think_block_splits_into_reasoning_and_content():
    with start("--reasoning-parser", "qwen3", "--reasoning-field", "both") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        regex = "<think>[a-z ]{1,20}</think>\n\n[a-z]{1,10}"
        result = run_both(client, temperature=0, max_tokens=60, extra_body={"structured_outputs": {"regex": regex}})
        assert result["finish_reason"] == "stop" and result["reasoning"] and result["content"]
        assert "<think>" not in result["content"] and "think>" not in result["reasoning"]
        body = {"model": server.model, "messages": USER, "max_tokens": 60, "temperature": 0,
                "structured_outputs": {"regex": regex}, "include_reasoning": False}
        message = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120).json()["choices"][0]
        assert "reasoning" not in message["message"] and message["message"]["content"] == result["content"]


def test_bad_tool_requests_are_400s_and_leave_the_server_healthy(hermes):
    server, client = hermes
    bad_schema = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "strin"}}}}}]
    cases = [({"tools": bad_schema, "tool_choice": "required"}, "tools[0].function.parameters"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
               "structured_outputs": {"regex": "a"}}, "tool_choice"),
             ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice")]
    for extra, param in cases:
        response = httpx.post(server.base_url + "/chat/completions", timeout=30,
                              json={"model": server.model, "messages": USER, "max_tokens": 5, **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert httpx.get(server.url + "/health").status_code == 200
    assert client.chat.completions.create(model=server.model, messages=USER, max_tokens=2).choices
