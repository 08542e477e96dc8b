"""Ollama's routes over a FakeEngine, through the official `ollama` client: every route answers in Ollama's
shapes, a stream and a whole answer carry the same text, options become sampling params (unknown ones are
logged once), the context is never cut (num_ctx or a prompt beyond it is a 400 naming it), images, think
and the model-management routes get clear errors (never a 404), and tools and reasoning come back in
Ollama's fields."""

from __future__ import annotations

import logging

import httpx
import ollama
import orjson
import pytest

from engine.outputs import EngineDeadError
from frontend.config import ServerConfig
from frontend.ollama import options as ollama_options
from tests.conftest import shared_path
from tests.frontend.harness import TINY_MAX_MODEL_LEN, serve_fake
from tests.frontend.openai.test_tool_calling import QWEN3, SCRIPT, TOOLS

USER = [{"role": "user", "content": "hi"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def client(served):
    server, _ = served
    return ollama.Client(host=server.url, timeout=10)


def test_tags_show_ps_version_describe_the_served_model(client, http):
    listed = client.list().models
    assert [m.model for m in listed] == ["tiny"]
    assert listed[0].details.family == "qwen3" and listed[0].details.format == "safetensors"
    shown = client.show("tiny")
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo["qwen3.context_length"] == TINY_MAX_MODEL_LEN
    assert "im_start" in shown.template
    assert client.show("tiny:latest").details.family == "qwen3"         # Ollama's tag names the same model
    running = client.ps().models
    assert running[0].model == "tiny" and running[0].context_length == TINY_MAX_MODEL_LEN
    assert running[0].expires_at.year == 9999                          # one engine: never unloaded
    version = http.get("/api/version").json()["version"]
    assert tuple(int(x) for x in version.split(".")) >= (0, 6, 4)      # clients refuse older Ollamas


def test_chat_stream_and_whole_answer_agree(client, served):
    _, fake = served
    whole = client.chat(model="tiny", messages=USER, options=GREEDY, stream=False)
    parts = list(client.chat(model="tiny", messages=USER, options=GREEDY, stream=True))
    assert whole.message.content == "".join(p.message.content for p in parts) == "The quick br"
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    for answer in (whole, parts[-1]):
        assert answer.done_reason == "length" and answer.eval_count == 12
        assert answer.prompt_eval_count == len(fake.submitted[-1][1])
        assert answer.total_duration >= answer.prompt_eval_duration > 0 and answer.load_duration == 0
    assert whole.created_at.endswith("Z")


def test_generate_stream_whole_raw_and_context(client, served):
    _, fake = served
    whole = client.generate(model="tiny", prompt="hello", system="be brief", options=GREEDY, stream=False)
    parts = list(client.generate(model="tiny", prompt="hello", system="be brief", options=GREEDY, stream=True))
    assert whole.response == "".join(p.response for p in parts) == "The quick br"
    prompt = fake.submitted[-1][1]
    assert whole.context == parts[-1].context == prompt + fake.script[:12]
    templated = bytes(t for t in prompt if t < 256).decode()
    assert "system\nbe brief" in templated and "user\nhello" in templated
    raw = client.generate(model="tiny", prompt="hello", raw=True, options=GREEDY, stream=False)
    assert fake.submitted[-1][1] == list(b"hello") and raw.context is None
    # context: the earlier exchange's ids come first
    follow = client.generate(model="tiny", prompt="again", context=whole.context, options=GREEDY, stream=False)
    assert fake.submitted[-1][1][:len(whole.context)] == whole.context
    assert follow.prompt_eval_count == len(fake.submitted[-1][1])


def test_options_become_sampling_params_and_unknown_ones_are_logged_once(client, served, caplog):
    _, fake = served
    ollama_options._ignored_logged.discard("mirostat")
    options = {"temperature": 0.5, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "seed": 7, "num_predict": 3,
               "stop": ["zzz"], "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25,
               "num_ctx": 256, "mirostat": 1}
    with caplog.at_level(logging.WARNING, logger="ringserve.ollama"):
        client.chat(model="tiny", messages=USER, options=options, stream=False)
        client.chat(model="tiny", messages=USER, options=options, stream=False)
    params = fake.submitted[-1][2]
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed) == (0.5, 0.9, 0, 0.05, 7)
    assert params.max_tokens == 3 and params.stop == ["zzz"] and params.repetition_penalty == 1.2
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, 0.25)
    assert [r.getMessage() for r in caplog.records].count(
        "Ollama option 'mirostat' is not supported and is ignored (logged once)") == 1
    # num_predict -1 (and unset): until the context (num_ctx) is full, never past it
    client.chat(model="tiny", messages=USER, options={"num_predict": -1, "num_ctx": 64}, stream=False)
    assert fake.submitted[-1][2].max_tokens == 64 - len(fake.submitted[-1][1])
    client.chat(model="tiny", messages=USER, options={"num_predict": 1000}, stream=False)
    assert fake.submitted[-1][2].max_tokens == TINY_MAX_MODEL_LEN - len(fake.submitted[-1][1])


@pytest.mark.parametrize("body, param", [
    ({"options": {"num_ctx": TINY_MAX_MODEL_LEN + 1}}, "options.num_ctx"),        # beyond the model
    ({"options": {"num_ctx": 8}}, "options.num_ctx"),                            # the prompt does not fit
    ({"messages": [{"role": "user", "content": "x" * 2000}]}, "messages"),         # beyond the model
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"top_p": 2}}, "options.top_p"),
    ({"options": {"num_predict": 0}}, "options.num_predict"),
    ({"keep_alive": "5 minutes"}, "keep_alive"),
    ({"think": True}, "think"),
    ({"format": "xml"}, "format"),
    ({"format": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "format"),
    ({"messages": [{"role": "user", "content": "see", "images": ["aGk="]}]}, "messages[0].images"),
    ({"logprobs": True}, "logprobs"),
])
def test_bad_chat_requests_are_400s_naming_the_field(http, served, body, param):
    _, fake = served
    before = len(fake.submitted)
    response = http.post("/api/chat", json={"model": "tiny", "messages": USER, "stream": False, **body})
    assert response.status_code == 400, response.text
    assert list(response.json()) == ["error"] and param in response.json()["error"]
    assert len(fake.submitted) == before                   # nothing reached the engine


def test_generate_refuses_what_it_cannot_do(http):
    for body, param in (({"images": ["aGk="]}, "images"), ({"suffix": "end"}, "suffix"),
                        ({"template": "{{ .Prompt }}"}, "template"), ({"context": [10**9]}, "context")):
        response = http.post("/api/generate", json={"model": "tiny", "prompt": "x", **body})
        assert response.status_code == 400 and param in response.json()["error"], response.text


def test_model_management_routes_answer_an_error_not_a_404(client, http):
    for call, args in ((client.pull, ("llama3",)), (client.push, ("tiny",)), (client.delete, ("tiny",)),
                       (client.copy, ("tiny", "other")), (client.create, ("new",))):
        with pytest.raises(ollama.ResponseError) as info:
            call(*args, **({"from_": "tiny"} if call == client.create else {}))
        assert info.value.status_code == 400 and "ringserve" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="other", messages=USER)
    assert info.value.status_code == 404 and "other" in info.value.error
    missing = http.post("/api/chat", json={"model": "", "messages": USER})
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}
    assert http.post("/api/chat", content=b"{", headers={"content-type": "application/json"}).status_code == 400


def test_empty_chat_or_prompt_loads_and_keep_alive_is_read(client, http):
    assert client.generate(model="tiny").done_reason == "load"
    loaded = http.post("/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0}).json()
    assert loaded["done"] and loaded["done_reason"] == "load"       # one engine stays loaded (see keep_alive.py)
    for keep_alive in ("5m", "1h30m", -1, "-1s", 300, "0"):
        assert http.post("/api/generate", json={"model": "tiny", "keep_alive": keep_alive}).status_code == 200


def test_an_engine_failure_mid_stream_is_an_error_line(served, http):
    server, fake = served
    server.call(setattr, fake, "step_delay", 0.05)
    try:
        with http.stream("POST", "/api/chat", json={"model": "tiny", "messages": USER,
                                                    "options": {"num_predict": 50}}) as response:
            lines = response.iter_lines()
            assert '"done":false' in next(lines)
            server.call(fake.fail_unfinished, EngineDeadError("the server shut down"))
            rest = list(lines)
    finally:
        server.call(setattr, fake, "step_delay", 0.0)
    assert response.headers["content-type"] == "application/x-ndjson"
    assert rest and orjson.loads(rest[-1]) == {"error": "the engine is not running: the server shut down"}


@pytest.fixture(scope="module")
def agent():
    config = ServerConfig(log_stats_interval=0, shutdown_timeout=1.0, enable_auto_tool_choice=True,
                          tool_call_parser="hermes", reasoning_parser="qwen3")
    server, fake = serve_fake(shared_path("models", "configs", "qwen3-0.6b"), server=config,
                              engine_overrides=QWEN3, script=SCRIPT)
    fake.eos_after = len(fake.script)
    with server:
        yield ollama.Client(host=server.url, timeout=10), fake


def test_tools_and_thinking_in_ollamas_fields_streamed_and_whole(agent):
    client, fake = agent
    assert set(client.show("tiny").capabilities) == {"completion", "tools", "thinking"}
    body = dict(model="tiny", messages=[{"role": "user", "content": "Weather in 東京?"}], tools=TOOLS,
                options={"temperature": 0}, think=True)
    whole = client.chat(**body, stream=False)
    parts = list(client.chat(**body, stream=True))
    streamed_calls = [call for p in parts for call in p.message.tool_calls or ()]
    for message, calls, thinking, content in (
            (whole.message, whole.message.tool_calls, whole.message.thinking, whole.message.content),
            (None, streamed_calls, "".join(p.message.thinking or "" for p in parts),
             "".join(p.message.content for p in parts))):
        assert thinking == "\nThey want the weather in 東京.\n"
        assert content == "Checking."
        assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "東京", "days": [1, 2]}), ("get_time", {})]
    # an earlier turn's calls (arguments as objects) and the tool's answer go back into the prompt
    history = [*body["messages"], {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "東京"}}}]},
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    client.chat(**{**body, "messages": history}, stream=False)
    assert len(fake.submitted[-1][1]) > len(fake.submitted[-2][1])


def test_format_becomes_a_structured_output(agent):
    client, fake = agent
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    client.chat(model="tiny", messages=[{"role": "user", "content": "x"}], format=schema, stream=False,
                options={"num_predict": 4})
    assert fake.submitted[-1][2].structured_outputs.json == schema
    client.generate(model="tiny", prompt="x", format="json", stream=False, options={"num_predict": 4})
    assert fake.submitted[-1][2].structured_outputs.json_object is True


def test_errors_under_api_keep_ollamas_shape_before_any_handler(served):
    server, _ = served
    wrong_host = httpx.post(server.url + "/api/chat", json={}, headers={"host": "evil.example"})
    assert wrong_host.status_code == 403 and list(wrong_host.json()) == ["error"]
    not_json = httpx.post(server.url + "/api/chat", content=b"model=tiny", headers={"content-type": "text/plain"})
    assert not_json.status_code == 415 and list(not_json.json()) == ["error"]
    assert httpx.get(server.url + "/api/nothing").json() == {"error": "Not Found"}
