"""Tool calls and reasoning through the server (real Qwen3 and Llama 3 tokenizers, a FakeEngine whose greedy
output spells a scripted reply): `auto` finds the calls, a stream carries the same reasoning, content and
calls as the whole response in OpenAI's delta shape, and the flags and request fields shape it."""

from __future__ import annotations

import json

import openai
import pytest

from frontend.config import ServerConfig
from tests.conftest import shared_path
from tests.frontend.harness import serve_fake

QWEN3 = {"tokenizer": str(shared_path("models", "tokenizers", "qwen3")), "max_model_len": 4096}
WEATHER_ARGS = '{"city": "東京", "days": [1, 2]}'
SCRIPT = ("<think>\nThey want the weather in 東京.\n</think>\n\nChecking.\n<tool_call>\n"
          '{"name": "get_weather", "arguments": ' + WEATHER_ARGS + '}\n</tool_call>\n<tool_call>\n'
          '{"name": "get_time", "arguments": {}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "array"}}}}},
         {"type": "function", "function": {"name": "get_time"}}]
USER = [{"role": "user", "content": "Weather in 東京?"}]


def serve(script: str, model: str = "qwen3-0.6b", overrides: dict | None = None, **server_options):
    config = ServerConfig(log_stats_interval=0, shutdown_timeout=1.0, **server_options)
    server, fake = serve_fake(shared_path("models", "configs", model), server=config,
                              engine_overrides=overrides or QWEN3, script=script)
    fake.eos_after = len(fake.script)          # the script once, then EOS
    return server, fake


@pytest.fixture(scope="module")
def agent():
    server, fake = serve(SCRIPT, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        yield client, fake


def collect(chunks) -> dict:
    """A stream folded into one message, checking OpenAI's delta shape on the way."""
    reasoning, content, calls, finishes = [], [], {}, []
    for chunk in chunks:
        choice = chunk.choices[0]
        delta = choice.delta
        reasoning.append(getattr(delta, "reasoning", None) or "")
        content.append(delta.content or "")
        for call in delta.tool_calls or ():
            if call.index not in calls:
                assert call.id and call.type == "function" and call.function.name
                assert call.function.arguments == ""
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": []}
            else:
                assert call.id is None and call.function.name is None
                calls[call.index]["arguments"].append(call.function.arguments)
        if choice.finish_reason is not None:
            finishes.append(choice.finish_reason)
    assert len(finishes) == 1 and chunks[-1].choices[0].finish_reason == finishes[0]
    return {"reasoning": "".join(reasoning) or None, "content": "".join(content) or None,
            "calls": [(c["name"], "".join(c["arguments"])) for _, c in sorted(calls.items())],
            "ids": [c["id"] for c in calls.values()], "finish_reason": finishes[0]}


def whole(result) -> dict:
    choice = result.choices[0]
    message = choice.message
    return {"reasoning": getattr(message, "reasoning", None), "content": message.content or None,
            "calls": [(c.function.name, c.function.arguments) for c in message.tool_calls or ()],
            "ids": [c.id for c in message.tool_calls or ()], "finish_reason": choice.finish_reason}


def test_auto_finds_calls_and_the_stream_equals_the_whole_response(agent):
    client, fake = agent
    result = whole(client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=0))
    assert result["reasoning"] == "\nThey want the weather in 東京.\n"
    assert result["content"] == "Checking."
    assert result["calls"] == [("get_weather", WEATHER_ARGS), ("get_time", "{}")]
    assert result["finish_reason"] == "tool_calls"
    assert len(set(result["ids"])) == 2
    assert fake.submitted[-1][2].skip_special_tokens is False     # hermes' markers may be special tokens
    streamed = collect(list(client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS,
                                                           temperature=0, stream=True)))
    assert {k: v for k, v in streamed.items() if k != "ids"} == {k: v for k, v in result.items() if k != "ids"}


def test_parallel_tool_calls_false_keeps_the_first_call(agent):
    client, _ = agent
    kwargs = dict(model="tiny", messages=USER, tools=TOOLS, temperature=0, parallel_tool_calls=False)
    assert whole(client.chat.completions.create(**kwargs))["calls"] == [("get_weather", WEATHER_ARGS)]
    assert collect(list(client.chat.completions.create(**kwargs, stream=True)))["calls"] == \
        [("get_weather", WEATHER_ARGS)]


def test_include_reasoning_false_drops_it(agent):
    client, _ = agent
    kwargs = dict(model="tiny", messages=USER, tools=TOOLS, temperature=0, extra_body={"include_reasoning": False})
    assert whole(client.chat.completions.create(**kwargs))["reasoning"] is None
    streamed = collect(list(client.chat.completions.create(**kwargs, stream=True)))
    assert streamed["reasoning"] is None and streamed["content"] == "Checking."


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN3["tokenizer"])


def test_tool_choice_none_renders_the_tools_and_parses_no_calls(agent, tokenizer):
    client, fake = agent
    result = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="none",
                                            temperature=0)
    prompt = tokenizer.apply_chat_template(USER, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert fake.submitted[-1][1] == tokenizer(prompt, add_special_tokens=False).input_ids
    assert "<tools>" in prompt
    message = result.choices[0].message
    assert message.tool_calls == [] and message.content.startswith("Checking.\n<tool_call>")
    assert result.choices[0].finish_reason == "stop"


def test_enable_thinking_false_means_no_reasoning_to_split(agent):
    client, fake = agent
    result = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = result.choices[0].message
    assert getattr(message, "reasoning", None) is None
    assert message.content.startswith("<think>")          # the prompt closed the block: this is content
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_time"]


def test_earlier_turns_with_calls_and_reasoning_render_as_transformers(agent, tokenizer):
    client, fake = agent
    messages = [*USER, {"role": "assistant", "content": None, "reasoning": "look it up", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0, max_tokens=1)
    expected = [*USER, {"role": "assistant", "content": "", "reasoning_content": "look it up", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": json.loads(WEATHER_ARGS)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    prompt = tokenizer.apply_chat_template(expected, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert fake.submitted[-1][1] == tokenizer(prompt, add_special_tokens=False).input_ids


def test_bad_tools_are_400s_naming_the_field(agent):
    client, _ = agent
    cases = [({"tools": []}, "tools"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
             ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
             ({"tools": [TOOLS[1]] * 129}, "tools"),
             ({"tool_choice": "required"}, "tool_choice")]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=USER, max_tokens=1, **extra)
        assert info.value.response.json()["error"]["param"] == param, extra
    assert client.chat.completions.create(model="tiny", messages=USER, max_tokens=1).choices


def test_reasoning_field_both_and_default_template_kwargs():
    """deepseek_r1 with both field names; --default-chat-template-kwargs applies under the request's own."""
    server, fake = serve("<think>why</think>\n\nbecause", reasoning_parser="deepseek_r1", reasoning_field="both",
                         default_chat_template_kwargs={"enable_thinking": False})
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        thinking = {"chat_template_kwargs": {"enable_thinking": True}}
        message = client.chat.completions.create(model="tiny", messages=USER, temperature=0,
                                                 extra_body=thinking).choices[0].message
        assert (message.reasoning, message.reasoning_content, message.content) == ("why", "why", "because")
        chunks = list(client.chat.completions.create(model="tiny", messages=USER, temperature=0, stream=True,
                                                     extra_body=thinking))
        assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == "why"
        assert "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks) == "why"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "because"
        # the default closes the think block in the prompt: the output is content
        message = client.chat.completions.create(model="tiny", messages=USER, temperature=0).choices[0].message
        assert getattr(message, "reasoning", None) is None and message.content == "<think>why</think>\n\nbecause"
        assert fake.submitted[-1][1][-4:] != fake.submitted[-2][1][-4:]


def test_llama3_json_with_our_tool_template():
    from transformers import AutoTokenizer

    template = "frontend/chat_templates/llama3_json.jinja"
    tokenizer_dir = str(shared_path("models", "tokenizers", "llama3"))
    server, fake = serve('{"name": "get_weather", "parameters": ' + WEATHER_ARGS + '}; {"name": "get_time", '
                         '"parameters": {}}', model="llama-3.2-1b", overrides={"tokenizer": tokenizer_dir,
                                                                                "max_model_len": 4096},
                         chat_template=template, enable_auto_tool_choice=True, tool_call_parser="llama3_json")
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        result = whole(client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=0))
        assert result["calls"] == [("get_weather", WEATHER_ARGS), ("get_time", "{}")]
        assert result["content"] is None and result["finish_reason"] == "tool_calls"
        streamed = collect(list(client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS,
                                                               temperature=0, stream=True)))
        assert streamed["calls"] == result["calls"]
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        with open(template) as f:
            prompt = tokenizer.apply_chat_template(USER, tools=TOOLS, chat_template=f.read(), tokenize=False,
                                                   add_generation_prompt=True)
        assert fake.submitted[-1][1] == tokenizer(prompt, add_special_tokens=False).input_ids


def test_forced_calls_carry_their_grammar_and_keep_the_engines_finish_reason(agent):
    """required/named: the request carries a structural tag in hermes' format after an optional think block
    (qwen3 reasoning); the output is read by the same parser; content is ""; finish_reason stays "stop"."""
    client, fake = agent
    result = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="required",
                                            temperature=0)
    tag = json.loads(fake.submitted[-1][2].structured_outputs.structural_tag)
    think, calls = tag["format"]["elements"]
    assert think["type"] == "optional" and think["content"]["elements"][0]["begin"] == "<think>"
    assert calls["type"] == "tags_with_separator" and calls["at_least_one"] and not calls["stop_after_first"]
    assert [t["begin"] for t in calls["tags"]] == ['<tool_call>\n{"name": "get_weather", "arguments": ',
                                                   '<tool_call>\n{"name": "get_time", "arguments": ']
    choice = result.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content == ""
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "get_time"]
    named = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    tag = json.loads(fake.submitted[-1][2].structured_outputs.structural_tag)
    assert [t["begin"] for t in tag["format"]["elements"][1]["tags"]] == \
        ['<tool_call>\n{"name": "get_time", "arguments": ']
    assert named.choices[0].finish_reason == "stop"


def test_forced_calls_refuse_other_constraints_and_bad_schemas(agent):
    client, _ = agent
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "format": "colour"}}}}}]
    cases = [({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
               "extra_body": {"structured_outputs": {"regex": "a+"}}}, "tool_choice"),
             ({"tools": bad, "tool_choice": "required"}, "tools[0].function.parameters")]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=USER, max_tokens=1, **extra)
        assert info.value.response.json()["error"]["param"] == param, info.value.response.text
    # the same schema is only shown to the model under "auto": no grammar, no refusal
    assert client.chat.completions.create(model="tiny", messages=USER, tools=bad, max_tokens=1).choices


def test_each_choice_parses_on_its_own_and_logprobs_cover_every_token(agent):
    client, fake = agent
    chunks = list(client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=0, n=2,
                                                 stream=True, logprobs=True))
    for index in (0, 1):
        mine = [c for c in chunks if c.choices and c.choices[0].index == index]
        folded = collect(mine)
        assert folded["calls"] == [("get_weather", WEATHER_ARGS), ("get_time", "{}")]
        assert folded["finish_reason"] == "tool_calls"
        logprobs = [t for c in mine if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        assert len(logprobs) == len(fake.script) + 1          # every token, the EOS included
