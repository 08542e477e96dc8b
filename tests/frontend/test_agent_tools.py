"""Tool calls and reasoning through the agent APIs, over a fake engine whose greedy output is a scripted
Qwen3-style turn: `<think>` reasoning, some text, then a hermes tool call. The chat path's parsers
(--reasoning-parser qwen3, --tool-call-parser hermes, tool_choice auto) split it; Anthropic gets thinking,
text and tool_use blocks with stop_reason tool_use, Responses gets reasoning, message and function_call
items; create and stream agree, and the tool round trip continues the conversation."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from frontend.config import ServerConfig
from tests.frontend.harness import serve_fake

CALL = '{"name": "get_time", "arguments": {"tz": "UTC"}}'
SCRIPT = f"<think>plan</think>Sure.<tool_call>\n{CALL}\n</tool_call>"
TOOL = {"name": "get_time", "description": "the time", "input_schema": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
FUNCTION = {"type": "function", "name": "get_time", "parameters": TOOL["input_schema"]}


@pytest.fixture(scope="module")
def agent_server(tiny_model):
    config = ServerConfig(log_stats_interval=0, enable_auto_tool_choice=True, tool_call_parser="hermes",
                          reasoning_parser="qwen3")
    server, fake = serve_fake(tiny_model, server=config, script=SCRIPT, eos_after=len(SCRIPT))
    with server:
        yield server, fake


def prompt_text(fake) -> str:
    return bytes(t for t in fake.submitted[-1][1] if t < 256).decode()


def test_messages_thinking_text_and_tool_use(agent_server):
    server, fake = agent_server
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=10)
    body = dict(model="tiny", max_tokens=200, tools=[TOOL], messages=[{"role": "user", "content": "time?"}],
                extra_body={"temperature": 0})
    message = claude.messages.create(**body)
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, call = message.content
    assert (thinking.thinking, text.text) == ("plan", "Sure.")
    assert (call.name, call.input) == ("get_time", {"tz": "UTC"}) and call.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    with claude.messages.stream(**body) as stream:
        partial_json = "".join(e.delta.partial_json for e in stream
                               if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        streamed = stream.get_final_message()
    assert json.loads(partial_json) == {"tz": "UTC"}
    assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use"]
    assert streamed.content[2].input == call.input and streamed.stop_reason == "tool_use"

    # the tool round trip: the call and its result go back as chat messages
    follow = claude.messages.create(model="tiny", max_tokens=3, tools=[TOOL], messages=[
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12:00"}]},
    ])
    assert follow.type == "message"
    assert prompt_text(fake).endswith("assistant\nSure.\ntool\n12:00\nassistant\n")


def test_responses_reasoning_message_and_function_call(agent_server):
    server, fake = agent_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    body = dict(model="tiny", input="time?", tools=[FUNCTION], temperature=0)
    created = client.responses.create(**body)
    assert [item.type for item in created.output] == ["reasoning", "message", "function_call"]
    reasoning, message, call = created.output
    assert reasoning.content[0].text == "plan" and message.content[0].text == "Sure."
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"tz": "UTC"})
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert created.usage.output_tokens_details.reasoning_tokens == len("plan")     # one token per byte here

    raw = httpx.post(server.url + "/v1/responses", json={**body, "stream": True}, timeout=10).text
    events = [json.loads(line[len("data: "):]) for line in raw.splitlines() if line.startswith("data: ")]
    types = [e["type"] for e in events]
    assert "response.reasoning_text.delta" in types and "response.function_call_arguments.done" in types
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert arguments == final["output"][2]["arguments"]
    assert json.loads(arguments) == {"tz": "UTC"}
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [item["id"] for item in final["output"]]

    # the tool round trip through previous_response_id: only the tool's output is sent
    follow = client.responses.create(model="tiny", previous_response_id=created.id, tools=[FUNCTION],
                                     max_output_tokens=3, input=[
                                         {"type": "function_call_output", "call_id": call.call_id,
                                          "output": "12:00"}])
    assert follow.status == "incomplete"
    assert prompt_text(fake).endswith("user\ntime?\nassistant\nSure.\ntool\n12:00\nassistant\n")
