"""POST /v1/messages and /v1/messages/count_tokens through the official anthropic SDK, over the fake engine:
create and stream agree, the stream's event framing, stop reasons, count_tokens, the translation of
multi-turn conversations with tool results into the chat prompt, auth, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import httpx
import msgspec
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from frontend.anthropic.protocol import MessagesRequest
from frontend.anthropic.translate import to_chat_request
from frontend.config import ServerConfig
from tests.frontend.fake_engine import SCRIPT
from tests.frontend.harness import serve_fake

USER = [{"role": "user", "content": "hi"}]
EVENTS = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture
def claude(served):
    server, _ = served
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=10)


def sse_frames(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event name, data) per SSE frame; every frame must carry both lines."""
    frames = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(lines) == {"event", "data"}, block
        frames.append((lines["event"], json.loads(lines["data"])))
    return frames


def prompt_text(fake) -> str:
    return bytes(t for t in fake.submitted[-1][1] if t < 256).decode()


def test_create_and_stream_agree(claude):
    kwargs = dict(model="tiny", max_tokens=12, messages=USER, extra_body={"temperature": 0})
    message = claude.messages.create(**kwargs)
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == SCRIPT[:12]
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 12 and message.usage.input_tokens > 0
    with claude.messages.stream(**kwargs) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert "".join(texts) == message.content[0].text
    assert len(texts) > 1                                        # it really streamed, token by token
    assert [b.model_dump(include={"type", "text"}) for b in streamed.content] == \
        [b.model_dump(include={"type", "text"}) for b in message.content]
    assert (streamed.stop_reason, streamed.usage.input_tokens, streamed.usage.output_tokens) == \
        (message.stop_reason, message.usage.input_tokens, message.usage.output_tokens)


def test_stream_frames_have_event_lines_in_protocol_order(http):
    body = {"model": "tiny", "max_tokens": 5, "messages": USER, "stream": True, "temperature": 0}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(response)
    for event, data in frames:
        assert data["type"] == event
        if event != "ping":
            EVENTS.validate_python(data)                         # each event is what the SDK's types say
    names = [event for event, _ in frames]
    assert names[:4] == ["message_start", "ping", "content_block_start", "content_block_delta"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert frames[0][1]["message"]["content"] == [] and frames[0][1]["message"]["stop_reason"] is None
    assert frames[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert frames[-2][1]["usage"]["output_tokens"] == 5
    assert "".join(d["delta"]["text"] for e, d in frames if e == "content_block_delta") == SCRIPT[:5]


def test_raw_response_validates_against_the_sdk_types(http):
    raw = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 3, "messages": USER}).json()
    Message.model_validate(raw, strict=False)
    assert raw["usage"]["cache_read_input_tokens"] == 0


def test_stop_reasons(claude, served):
    server, fake = served
    stopped = claude.messages.create(model="tiny", max_tokens=40, messages=USER, stop_sequences=["brown"],
                                     extra_body={"temperature": 0})
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "brown")
    assert stopped.content[0].text == "The quick "
    server.call(setattr, fake, "eos_after", 4)
    try:
        ended = claude.messages.create(model="tiny", max_tokens=40, messages=USER, extra_body={"temperature": 0})
        with claude.messages.stream(model="tiny", max_tokens=40, messages=USER,
                                    extra_body={"temperature": 0}) as stream:
            streamed = stream.get_final_message()
    finally:
        server.call(setattr, fake, "eos_after", None)
    assert (ended.stop_reason, ended.stop_sequence) == ("end_turn", None)
    assert ended.content[0].text == SCRIPT[:4]                 # the EOS token is not text
    assert streamed.stop_reason == "end_turn" and streamed.content[0].text == ended.content[0].text


def test_count_tokens_matches_the_prompt_of_create(claude, served):
    _, fake = served
    conversation = dict(model="tiny", system="Be brief.", messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}])
    counted = claude.messages.count_tokens(**conversation)
    created = claude.messages.create(max_tokens=1, **conversation)
    assert counted.input_tokens == created.usage.input_tokens == len(fake.submitted[-1][1])
    assert prompt_text(fake) == ("system\nBe brief.\nuser\nhi\nassistant\nhello\nuser\nmore\nassistant\n")


def test_tool_results_follow_the_call_in_the_chat_prompt(claude, served):
    """A conversation with a tool round trip reaches the template as chat messages (tool messages right
    after the assistant's call); tool_choice none leaves the answer plain text."""
    _, fake = served
    tools = [{"name": "get_time", "description": "the time", "input_schema": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}]
    messages = [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": [{"type": "text", "text": "checking"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_time",
                                           "input": {"tz": "UTC"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"},
                                     {"type": "text", "text": "thanks"}]},
    ]
    reply = claude.messages.create(model="tiny", max_tokens=4, messages=messages, tools=tools,
                                   tool_choice={"type": "none"}, extra_body={"temperature": 0})
    assert reply.stop_reason == "max_tokens" and reply.content[0].text == SCRIPT[:4]
    assert prompt_text(fake).endswith("assistant\nchecking\ntool\n12:00\nuser\nthanks\nassistant\n")


def test_translation_to_chat():
    req = msgspec.json.decode(json.dumps({
        "model": "tiny", "max_tokens": 5,
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "r"}]}]},
        ]}), type=MessagesRequest)
    chat = to_chat_request(req, max_tokens=req.max_tokens)
    assert [(m.role, m.content) for m in chat.messages] == [("system", "a\nb"), ("user", "q"), ("assistant", ""),
                                                           ("tool", "r")]
    assistant = chat.messages[2]
    assert assistant.reasoning_content == "hmm"
    assert assistant.tool_calls == [{"id": "t1", "type": "function",
                                     "function": {"name": "f", "arguments": '{"x":1}'}}]
    assert chat.messages[3].tool_call_id == "t1"
    assert chat.tools == [{"type": "function", "function": {"name": "f", "description": "",
                                                            "parameters": {"type": "object"}}}]
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert chat.chat_template_kwargs == {"enable_thinking": False, "thinking": False}
    named = msgspec.structs.replace(req, tool_choice=msgspec.convert({"type": "tool", "name": "f"},
                                                                     type=type(req.tool_choice)))
    assert to_chat_request(named).tool_choice == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize("body,status,kind,names", [
    ({"model": "tiny", "messages": USER}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "tiny", "max_tokens": 0, "messages": USER}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "tiny", "max_tokens": 5, "messages": []}, 400, "invalid_request_error", "messages"),
    ({"model": "tiny", "max_tokens": 5, "messages": USER, "temperature": 1.5}, 400, "invalid_request_error",
     "temperature"),
    ({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, 400,
     "invalid_request_error", "messages[0].content[0].type"),
    ({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}, 400,
     "invalid_request_error", "messages[0].content[0].type"),
    ({"model": "tiny", "max_tokens": 5, "messages": USER, "tool_choice": {"type": "tool", "name": "nope"},
      "tools": [{"name": "f", "input_schema": {}}]}, 400, "invalid_request_error", "tool_choice.name"),
    ({"model": "tiny", "max_tokens": 5000, "messages": USER}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "claude-x", "max_tokens": 5, "messages": USER}, 404, "not_found_error", "claude-x"),
])
def test_errors_in_anthropic_shape_name_the_field(http, body, status, kind, names):
    response = http.post("/v1/messages", json=body)
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert names in error["error"]["message"]


def test_sdk_raises_typed_errors_and_the_server_stays_up(claude, http):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="tiny", max_tokens=5, messages=[{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="not-the-served-model", max_tokens=5, messages=USER)
    wrong_method = http.get("/v1/messages")
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    assert http.get("/health").status_code == 200


def test_claude_code_requests_are_accepted(http):
    """?beta=true, anthropic-version/anthropic-beta headers and keys ringserve ignores (metadata,
    cache_control, thinking budget) are all accepted."""
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    body = {"model": "tiny", "max_tokens": 3, "metadata": {"user_id": "u"}, "service_tier": "auto",
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "cache_control": {"type": "ephemeral"},
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    response = http.post("/v1/messages?beta=true", headers=headers, json=body)
    assert response.status_code == 200 and response.json()["type"] == "message"
    counted = http.post("/v1/messages/count_tokens?beta=true", headers=headers, json=body)
    assert counted.status_code == 200 and counted.json()["input_tokens"] == response.json()["usage"]["input_tokens"]


@pytest.fixture(scope="module")
def keyed(tiny_model):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, api_key="s3cret"))
    with server:
        yield server


def test_auth_by_x_api_key_or_bearer(keyed):
    body = {"model": "tiny", "max_tokens": 2, "messages": USER}
    ok = anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0)    # sends x-api-key
    assert ok.messages.create(**body).type == "message"
    bearer = anthropic.Anthropic(base_url=keyed.url, auth_token="s3cret", max_retries=0)
    assert bearer.messages.create(**body).type == "message"
    with pytest.raises(anthropic.AuthenticationError) as info:
        anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0).messages.create(**body)
    assert info.value.body == {"type": "error", "error": {
        "type": "authentication_error",
        "message": "invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"}}
    # the OpenAI routes take the x-api-key header too, and keep their own error shape
    assert httpx.get(keyed.url + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
    refused = httpx.get(keyed.url + "/v1/models", headers={"x-api-key": "nope"})
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"


def test_a_final_assistant_message_is_a_prefill(claude, served):
    _, fake = served
    reply = claude.messages.create(model="tiny", max_tokens=3, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}])
    assert prompt_text(fake) == "user\nhi\nassistant\nWell,"          # continued, not a new turn
    assert reply.content[0].text == SCRIPT[:3]                      # only the new text, as Anthropic answers


def test_server_tools_are_left_out(claude):
    reply = claude.messages.create(model="tiny", max_tokens=2, messages=USER, tool_choice={"type": "none"}, tools=[
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"name": "f", "input_schema": {"type": "object"}}])
    assert reply.type == "message"
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="tiny", max_tokens=2, messages=USER, tools=[{"name": "f"}])
    assert "tools[0].input_schema" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="tiny", max_tokens=2, messages=USER, tool_choice={"type": "tool", "name": "x"},
                               tools=[{"type": "web_search_20250305", "name": "x"}])
    assert "tool_choice.name" in info.value.body["error"]["message"]


def test_data_parallel_rank_header_is_honoured(http):
    body = {"model": "tiny", "max_tokens": 2, "messages": USER}
    assert http.post("/v1/messages", json=body, headers={"X-data-parallel-rank": "0"}).status_code == 200
    refused = http.post("/v1/messages", json=body, headers={"X-data-parallel-rank": "3"})
    assert refused.status_code == 400 and "X-data-parallel-rank" in refused.json()["error"]["message"]
    refused = http.post("/v1/responses", json={"model": "tiny", "input": "x"}, headers={"X-data-parallel-rank": "3"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-data-parallel-rank"
