"""POST /v1/responses, GET/DELETE /v1/responses/{id} through the official openai SDK, over the fake engine:
create and stream agree (texts and item ids), the event sequence, incomplete responses, input items
translated into the chat prompt, the store (previous_response_id round trip, bounds, expiry), errors."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from frontend.config import ServerConfig
from frontend.responses.store import ResponseStore
from tests.frontend.fake_engine import SCRIPT
from tests.frontend.harness import serve_fake

EVENTS = TypeAdapter(ResponseStreamEvent)


def prompt_text(fake) -> str:
    return bytes(t for t in fake.submitted[-1][1] if t < 256).decode()


def stream_events(http: httpx.Client, body: dict) -> list[dict]:
    response = http.post("/v1/responses", json={**body, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            event = EVENTS.validate_json(lines["data"]).model_dump(mode="json")
            assert lines["event"] == event["type"]
            events.append(event)
    return events


@pytest.fixture
def ending(served):
    """The fake engine ends greedy outputs with EOS after 6 tokens, so responses complete."""
    server, fake = served
    server.call(setattr, fake, "eos_after", 6)
    yield
    server.call(setattr, fake, "eos_after", None)


def test_create_and_stream_agree(client, http, ending):
    created = client.responses.create(model="tiny", input="hi", temperature=0)
    assert created.status == "completed" and created.incomplete_details is None
    assert created.output_text == SCRIPT[:6]
    assert created.id.startswith("resp_") and created.output[0].id.startswith("msg_")
    assert created.usage.output_tokens == 7 and created.usage.total_tokens == created.usage.input_tokens + 7
    with client.responses.stream(model="tiny", input="hi", temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == created.output_text and len(deltas) > 1
    assert final.status == "completed" and final.usage == created.usage


def test_stream_events_sequence_and_ids_match_the_final_object(http, ending):
    events = stream_events(http, {"model": "tiny", "input": "hi", "temperature": 0})
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    final = events[-1]["response"]
    Response.model_validate(final)
    item_id = final["output"][0]["id"]
    assert events[0]["response"]["id"] == final["id"] and events[0]["response"]["status"] == "in_progress"
    assert all(e["item_id"] == item_id for e in events if "item_id" in e)
    assert events[2]["item"]["id"] == events[-2]["item"]["id"] == item_id
    assert events[-4]["text"] == final["output"][0]["content"][0]["text"] == SCRIPT[:6]


def test_max_output_tokens_makes_an_incomplete_response(client, http):
    created = client.responses.create(model="tiny", input="hi", max_output_tokens=5, temperature=0)
    assert created.status == "incomplete" and created.incomplete_details.reason == "max_output_tokens"
    assert created.output_text == SCRIPT[:5] and created.output[0].status == "incomplete"
    events = stream_events(http, {"model": "tiny", "input": "hi", "max_output_tokens": 5, "temperature": 0})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_input_items_become_the_chat_prompt(client, served):
    _, fake = served
    client.responses.create(model="tiny", max_output_tokens=2, instructions="Be brief.", input=[
        {"role": "developer", "content": "dev"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "time?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"tz":"UTC"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "noon", "annotations": []}]},
        {"role": "user", "content": "thanks"},
    ], tools=[{"type": "function", "name": "get_time", "parameters": {"type": "object"}}], tool_choice="none")
    assert prompt_text(fake) == ("system\nBe brief.\nsystem\ndev\nuser\ntime?\nassistant\n\ntool\n12:00\n"
                                 "assistant\nnoon\nuser\nthanks\nassistant\n")


def test_previous_response_id_round_trip(client, served):
    _, fake = served
    first = client.responses.create(model="tiny", input="one", instructions="SYS", max_output_tokens=3,
                                    temperature=0)
    second = client.responses.create(model="tiny", input="two", previous_response_id=first.id,
                                     max_output_tokens=3, temperature=0)
    # instructions are not carried over; the first turn's input and output are
    assert prompt_text(fake) == f"user\none\nassistant\n{SCRIPT[:3]}\nuser\ntwo\nassistant\n"
    assert second.previous_response_id == first.id
    third = client.responses.create(model="tiny", input="three", previous_response_id=second.id,
                                    max_output_tokens=1)
    assert prompt_text(fake).startswith(f"user\none\nassistant\n{SCRIPT[:3]}\nuser\ntwo\nassistant\n{SCRIPT[:3]}")
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", input="x", previous_response_id=first.id)
    assert info.value.body["param"] == "previous_response_id"
    assert client.responses.retrieve(third.id).id == third.id      # the others are still there


def test_store_false_keeps_nothing(client):
    unstored = client.responses.create(model="tiny", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_streamed_responses_are_stored_too(client, http):
    events = stream_events(http, {"model": "tiny", "input": "x", "max_output_tokens": 2})
    final = events[-1]["response"]
    assert client.responses.retrieve(final["id"]).output[0].id == final["output"][0]["id"]


@pytest.fixture(scope="module")
def small_store(tiny_model):
    config = ServerConfig(log_stats_interval=0, responses_store_max_entries=2)
    server, _ = serve_fake(tiny_model, server=config)
    with server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)


def test_the_store_is_bounded(small_store):
    ids = [small_store.responses.create(model="tiny", input=str(i), max_output_tokens=1).id for i in range(3)]
    with pytest.raises(openai.NotFoundError):
        small_store.responses.retrieve(ids[0])                     # the oldest went first
    assert [small_store.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    with pytest.raises(openai.BadRequestError):
        small_store.responses.create(model="tiny", input="x", previous_response_id=ids[0])


def test_store_bounds_and_expiry():
    now = [0.0]
    store = ResponseStore(max_entries=3, max_bytes=100, ttl=10.0, clock=lambda: now[0])
    assert store.put("a", {}, [], 40) and store.put("b", {}, [], 40)
    assert store.put("c", {}, [], 40)                              # 120 bytes > 100: "a" goes
    assert store.get("a") is None and store.get("b") is not None and len(store) == 2
    assert not store.put("huge", {}, [], 101) and store.get("huge") is None
    now[0] = 5.0
    store.put("d", {}, [], 10)
    now[0] = 10.0                                                  # b and c (stored at 0) expire at 10
    assert store.get("b") is None and store.get("c") is None and store.get("d") is not None
    now[0] = 15.0
    assert len(store) == 0
    assert not ResponseStore(max_entries=0, max_bytes=100, ttl=1.0).put("x", {}, [], 1)


@pytest.mark.parametrize("body,param", [
    ({"model": "tiny"}, "input"),
    ({"model": "tiny", "input": []}, "input"),
    ({"model": "tiny", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"model": "tiny", "input": [{"type": "message", "content": "x"}]}, "input[0].role"),
    ({"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type"),
    ({"model": "tiny", "input": [{"type": "bogus"}]}, "input[0].type"),
    ({"model": "tiny", "input": "x", "tools": [{"type": "local_shell"}]}, "tools[0].type"),
    ({"model": "tiny", "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"model": "tiny", "input": "x", "tool_choice": "auto", "tools": [{"type": "web_search"}]}, "tool_choice"),
    ({"model": "tiny", "input": "x", "tool_choice": {"type": "function", "name": "f"}}, "tool_choice.name"),
    ({"model": "tiny", "input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"model": "tiny", "input": "x", "background": True}, "background"),
    ({"model": "tiny", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "tiny", "input": "x", "max_output_tokens": 5000}, "max_output_tokens"),
    ({"model": "tiny", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({"model": "tiny", "input": "x", "temperature": 3}, "temperature"),
])
def test_bad_requests_are_400_naming_the_field(http, body, param):
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_server_tools_are_left_out(client):
    reply = client.responses.create(model="tiny", input="x", max_output_tokens=1, tool_choice="none",
                                    tools=[{"type": "web_search"}, {"type": "function", "name": "f"}])
    assert reply.status == "incomplete" and [t.type for t in reply.tools] == ["web_search", "function"]


def test_unknown_model_and_unknown_id(http):
    assert http.post("/v1/responses", json={"model": "gpt-5", "input": "x"}).status_code == 404
    assert http.get("/v1/responses/resp_nope").status_code == 404
    assert http.delete("/v1/responses/resp_nope").status_code == 404
    assert http.get("/health").status_code == 200
