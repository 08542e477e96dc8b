"""End to end: Anthropic Messages and OpenAI Responses against the real `ringserve serve` (the demo model,
random weights, every process over the shm rings), through the official anthropic and openai SDKs."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.e2e.server import ServerProcess

KEY = "e2e-key"


@pytest.fixture(scope="module")
def server():
    with ServerProcess("ringserve-demo", "--api-key", KEY, "--responses-store-max-entries", "2", "--enable-auto-tool-choice",
                       "--tool-call-parser", "hermes") as s:
        yield s


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)


def test_messages_create_stream_and_count_tokens_agree(server, claude):
    body = dict(model=server.model, max_tokens=8, system="You are terse.",
                messages=[{"role": "user", "content": "Hello"}], extra_body={"temperature": 0})
    created = claude.messages.create(**body)
    assert created.stop_reason in ("max_tokens", "end_turn")
    with claude.messages.stream(**body) as stream:
        streamed_text = "".join(stream.text_stream)
        streamed = stream.get_final_message()
    assert streamed_text == created.content[0].text == streamed.content[0].text   # greedy: the same tokens
    assert streamed.usage.output_tokens == created.usage.output_tokens
    counted = claude.messages.count_tokens(model=server.model, system="You are terse.",
                                           messages=[{"role": "user", "content": "Hello"}])
    assert counted.input_tokens == created.usage.input_tokens


def test_messages_auth_and_error_shape(server):
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model=server.model, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"


def test_responses_create_stream_and_previous_response_id(server, client):
    created = client.responses.create(model=server.model, input="Hello", max_output_tokens=6, temperature=0)
    with client.responses.stream(model=server.model, input="Hello", max_output_tokens=6, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
    assert "".join(deltas) == created.output_text
    follow = client.responses.create(model=server.model, input="More", previous_response_id=created.id,
                                     max_output_tokens=2)
    # the follow-up's prompt holds the first turn: its input and its output tokens, and the new input
    assert follow.usage.input_tokens > created.usage.input_tokens + created.usage.output_tokens
    assert client.responses.retrieve(follow.id).output_text == follow.output_text
    # the store keeps two responses (--responses-store-max-entries 2): a third evicts the first
    client.responses.create(model=server.model, input="x", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    assert server.proc.poll() is None


def test_messages_stop_reasons(server, claude):
    body = dict(model=server.model, max_tokens=12, messages=[{"role": "user", "content": "Hi"}],
                extra_body={"temperature": 0})
    free = claude.messages.create(**body)
    assert free.stop_reason in ("max_tokens", "end_turn")
    text = free.content[0].text
    if free.stop_reason == "max_tokens":
        assert free.usage.output_tokens == 12
    stop = text[len(text) // 2:][:2]
    assert stop, "greedy output too short to pick a stop sequence from"
    stopped = claude.messages.create(**body, stop_sequences=[stop])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stopped.content[0].text == text[:text.index(stop)]


def test_messages_multi_turn_with_tool_results(server, claude):
    """A tool round trip in the history (tool_use, then tool_result) is accepted and reaches the prompt:
    the reply's input_tokens count the call and the result."""
    tool = {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}
    history = [{"role": "user", "content": "time?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_time",
                                                  "input": {"tz": "UTC"}}]}]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                           "content": "12:00 " * 10}]}
    short = claude.messages.count_tokens(model=server.model, tools=[tool], messages=history + [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"}]}])
    reply = claude.messages.create(model=server.model, max_tokens=3, tools=[tool], tool_choice={"type": "none"},
                                   messages=history + [result])
    assert reply.stop_reason in ("max_tokens", "end_turn")
    assert reply.usage.input_tokens - short.input_tokens == len("12:00 " * 10) - len("12:00")  # a byte a token


FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}


def test_structured_outputs_through_both_apis(server, claude, client):
    """text.format (Responses) and output_config.format (Messages) go through the grammar: random weights
    then write the schema's JSON (seeded, it completes), the same when streamed; a bad schema is a 400
    naming the API's own field."""
    body = dict(model=server.model, input="json", max_output_tokens=40, temperature=1, extra_body={"seed": 4},
                text={"format": {"type": "json_schema", "name": "flag", "schema": FLAG}})
    created = client.responses.create(**body)
    assert created.status == "completed"
    jsonschema.validate(json.loads(created.output_text), FLAG)
    with client.responses.stream(**body) as stream:
        assert stream.get_final_response().output_text == created.output_text
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=server.model, input="x",
                                text={"format": {"type": "json_schema", "name": "f", "schema": {"type": "strin"}}})
    assert info.value.body["param"] == "text.format.schema"

    greedy = dict(model=server.model, max_tokens=16, messages=[{"role": "user", "content": "json"}],
                  output_config={"format": {"type": "json_schema", "schema": FLAG}}, extra_body={"temperature": 0})
    message = claude.messages.create(**greedy)
    assert message.content[0].text.startswith("{")
    free = claude.messages.create(**{k: v for k, v in greedy.items() if k != "output_config"})
    assert not free.content[0].text.startswith("{")            # so the "{" is the grammar's doing
    with claude.messages.stream(**greedy) as stream:
        assert stream.get_final_message().content[0].text == message.content[0].text
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=server.model, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               output_config={"format": {"type": "json_schema", "schema": {"type": "strin"}}})
    assert "output_config.format.schema" in info.value.body["error"]["message"]


PICK = {"name": "pick", "description": "pick a colour",
        "input_schema": {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}},
                         "required": ["colour"], "additionalProperties": False}}


def test_messages_tool_choice_any_forces_a_valid_call(server, claude):
    """Random weights never call a tool; tool_choice any forces one through the grammar, so the call is
    real: a tool_use block whose input validates against the tool's schema, the same when streamed."""
    # the forced prefix `<tool_call>\n{"name": "pick", "arguments": ` alone is ~45 tokens of this byte tokenizer
    body = dict(model=server.model, max_tokens=200, tools=[PICK], messages=[{"role": "user", "content": "?"}],
                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                extra_body={"temperature": 1, "seed": 3})      # greedy, these weights write whitespace forever
    created = claude.messages.create(**body)
    calls = [block for block in created.content if block.type == "tool_use"]
    assert created.stop_reason == "tool_use" and len(calls) == 1 and calls[0].name == "pick"
    jsonschema.validate(calls[0].input, PICK["input_schema"])
    with claude.messages.stream(**body) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [("pick", calls[0].input)]
    # the result goes back and the conversation continues
    follow = claude.messages.create(model=server.model, max_tokens=4, tools=[PICK], messages=[
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "pick",
                                           "input": calls[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "ok"}]}])
    assert follow.type == "message"


def test_responses_tool_choice_required_forces_a_valid_call(server, client):
    function = {"type": "function", "name": "pick", "parameters": PICK["input_schema"]}
    body = dict(model=server.model, input="?", tools=[function], tool_choice="required",
                parallel_tool_calls=False, max_output_tokens=200, temperature=1, extra_body={"seed": 3})
    created = client.responses.create(**body)
    calls = [item for item in created.output if item.type == "function_call"]
    assert created.status == "completed" and len(calls) == 1 and calls[0].name == "pick"
    jsonschema.validate(json.loads(calls[0].arguments), PICK["input_schema"])
    with client.responses.stream(**body) as stream:
        final = stream.get_final_response()
    assert [(i.name, i.arguments) for i in final.output if i.type == "function_call"] == \
        [("pick", calls[0].arguments)]
    follow = client.responses.create(model=server.model, previous_response_id=created.id, tools=[function],
                                     max_output_tokens=2, input=[{"type": "function_call_output",
                                                                  "call_id": calls[0].call_id, "output": "ok"}])
    assert follow.usage.input_tokens > created.usage.input_tokens
