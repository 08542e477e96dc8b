"""Every invalid request gets the right status and OpenAI's error shape naming the param; fuzzing never
breaks the server."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from frontend.config import ServerConfig
from tests.frontend.harness import serve_fake

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "x"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def assert_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]
    return error


@pytest.mark.parametrize("path,body,param", [
    (COMPLETIONS, {"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "temperature": 2.5}, "temperature"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, "top_p"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, "n"),
    (COMPLETIONS, {"prompt": "x", "n": 129}, "n"),
    (COMPLETIONS, {"prompt": ["x"] * 10, "n": 100}, "n"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": -3}, "presence_penalty"),
    (COMPLETIONS, {"prompt": "x", "frequency_penalty": 2.01}, "frequency_penalty"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "stop": ["s"] * 65}, "stop"),
    (COMPLETIONS, {"prompt": "x", "stop": ""}, "stop"),
    (COMPLETIONS, {"prompt": "x", "seed": 2 ** 70}, "seed"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"9999": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [9999]}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 3, "min_tokens": 5}, "min_tokens"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", 1]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 99999]}, "prompt"),
    (COMPLETIONS, {"prompt": [[1], []]}, "prompt"),
    (COMPLETIONS, {"prompt": "x" * 512}, "prompt"),
    (COMPLETIONS, {"prompt": "x" * 100, "max_tokens": 413}, "max_tokens"),
    (COMPLETIONS, {"max_tokens": 3}, "prompt"),
    (COMPLETIONS, {"prompt": {"text": "x"}}, "prompt"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [{"content": "x"}]}, "messages[0].role"),
    (CHAT, {"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"messages": USER, "max_completion_tokens": 600}, "max_completion_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
     "messages[0].content[0].type"),
    (CHAT, {"messages": USER, "add_generation_prompt": True, "continue_final_message": True},
     "continue_final_message"),
    (CHAT, {"messages": USER, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    # Tools as vLLM checks them; "auto" (the default with tools) needs --enable-auto-tool-choice.
    (CHAT, {"messages": USER, "tools": [TOOL]}, "tool_choice"),
    (CHAT, {"messages": USER, "tools": [TOOL], "tool_choice": "auto"}, "tool_choice"),
    (CHAT, {"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    (CHAT, {"messages": USER, "tool_choice": "auto"}, "tool_choice"),
    (CHAT, {"messages": USER, "tools": [], "tool_choice": "none"}, "tools"),
    (CHAT, {"messages": USER, "tools": [TOOL] * 129, "tool_choice": "none"}, "tools"),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "a.b"}}], "tool_choice": "none"},
     "tools[0].function.name"),
    (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}],
     "tool_choice": "none"}, "tools[0].function.parameters"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "s"}}},
     "response_format.json_schema.schema"),
    (CHAT, {"messages": USER, "response_format": {}}, "response_format.type"),
])
def test_invalid_request_is_a_400_naming_the_param(http, path, body, param):
    assert_error(http.post(path, json=body), 400, param)


@pytest.mark.parametrize("extra", [
    {"tools": [TOOL], "tool_choice": "none", "parallel_tool_calls": False},
    {"response_format": {"type": "text"}},
])
def test_tool_choice_none_and_text_format_are_plain_chat(http, extra):
    response = http.post(CHAT, json={"messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


def test_malformed_json_is_a_400(http):
    error = assert_error(http.post(COMPLETIONS, content=b'{"prompt": "x",', headers={"content-type": "application/json"}),
                         400, None)
    assert "not valid JSON" in error["message"]


def test_deep_nesting_is_a_400(http):
    depth = 5000
    body = b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": ' \
           + b"[" * depth + b"]" * depth + b"}}"
    assert http.post(CHAT, content=body, headers={"content-type": "application/json"}).status_code == 400


def test_unknown_model_is_a_404(http):
    error = assert_error(http.post(COMPLETIONS, json={"model": "gpt-7", "prompt": "x"}), 404, "model")
    assert "gpt-7" in error["message"]


def test_unknown_route_and_method_use_the_error_shape(http):
    assert_error(http.get("/v1/nothing"), 404, None)
    assert_error(http.get(COMPLETIONS), 405, None)


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1, 2 ** 31, 2 ** 63, -(2 ** 63), 10 ** 30, rng.randint(-1000, 1000)])
    if kind == 2:
        return rng.choice([0.0, -0.5, 1e308, -1e308, 3.7, rng.uniform(-5, 5)])
    if kind in (3, 4, 5):
        return "".join(rng.choice("ab 🙂\x00\"\\{}<|im_end|>") for _ in range(rng.randrange(0, 20)))
    if kind in (6, 7):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(FIELDS): _random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
          "top_logprobs", "logit_bias", "stream", "stream_options", "echo", "min_tokens", "stop_token_ids",
          "role", "content", "type", "text", "include_usage", "priority", "cache_salt", "prompt_logprobs"]


def _fuzz_bodies(count: int):
    rng = random.Random(20240611)
    valid = [(COMPLETIONS, {"prompt": "hi", "max_tokens": 3}), (CHAT, {"messages": USER, "max_tokens": 3})]
    for i in range(count):
        path, base = valid[i % 2]
        style = i % 5
        if style == 0:      # raw bytes
            yield path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif style == 1:    # a random JSON document
            yield path, json.dumps(_random_json(rng)).encode()
        elif style == 2:    # a valid request with one field replaced by anything
            body = dict(base)
            body[rng.choice(FIELDS)] = _random_json(rng)
            yield path, json.dumps(body).encode()
        elif style == 3:    # huge numbers where numbers go
            body = dict(base)
            body[rng.choice(["max_tokens", "n", "seed", "temperature", "logprobs", "min_tokens"])] = \
                rng.choice([10 ** 400, -(10 ** 400), 2 ** 64, 1e309])
            yield path, json.dumps(body).encode().replace(b"Infinity", b"1e999")
        else:               # deep nesting in a free-form field
            depth = rng.randrange(50, 3000)
            yield path, b'{"prompt": "x", "messages": [], "chat_template_kwargs": {"k": ' + b"[" * depth \
                + b"]" * depth + b"}}"


def test_server_survives_500_malformed_bodies(http):
    statuses = set()
    for path, body in _fuzz_bodies(500):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
        statuses.add(response.status_code)
        assert response.status_code in (200, 400, 404), (body[:200], response.text)
        if response.status_code != 200:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert 400 in statuses
    assert http.get("/health").status_code == 200
    ok = http.post(COMPLETIONS, json={"prompt": "still fine", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.fixture(scope="module")
def small_body_server(tiny_model):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, max_request_body_bytes=4096))
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


def test_body_over_the_limit_is_a_413(small_body_server):
    body = {"prompt": "x" * 5000, "max_tokens": 1}
    assert_error(small_body_server.post(COMPLETIONS, json=body), 413, None)

    def chunked():     # no content-length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'
    assert_error(small_body_server.post(COMPLETIONS, content=chunked(), headers={"content-type": "application/json"}),
                 413, None)
    assert small_body_server.post(COMPLETIONS, json={"prompt": "x" * 100, "max_tokens": 1}).status_code == 200


def test_oversized_headers_are_refused(small_body_server):
    assert_error(small_body_server.get("/health", headers={"x-junk": "j" * 20000}), 431, None)
    assert small_body_server.get("/health").status_code == 200
