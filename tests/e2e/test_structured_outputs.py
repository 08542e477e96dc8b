"""End to end: structured outputs through the real server (demo model, random weights) with the official
openai client and raw httpx: every kind, chat and completions, streamed or not; the 400s leave it healthy;
a compile past its deadline is a 400 while other requests keep flowing (slow: the Qwen3 vocabulary)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from engine.sampling_params import StructuredOutputsParams
from tests.conftest import shared_path
from tests.e2e.server import ServerProcess
from tests.engine.structured_checks import BOUNDED_SCHEMA, CHOICES, EBNF, REGEX, check_output

EOS = [258]


@pytest.fixture(scope="module")
def server():
    with ServerProcess("ringserve-demo", "--max-model-len", "512") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


CASES = {
    "json_schema": ({"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": BOUNDED_SCHEMA}},
                     "structured_outputs": {"disable_any_whitespace": True}},
                    StructuredOutputsParams(json=BOUNDED_SCHEMA, disable_any_whitespace=True)),
    "regex": ({"structured_outputs": {"regex": REGEX}}, StructuredOutputsParams(regex=REGEX)),
    "choice": ({"guided_choice": CHOICES}, StructuredOutputsParams(choice=CHOICES)),
    "grammar": ({"structured_outputs": {"grammar": EBNF}}, StructuredOutputsParams(grammar=EBNF)),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_chat_stream_equals_non_stream_and_validates(server, client, kind):
    extra, so = CASES[kind]
    body = dict(extra)
    response_format = body.pop("response_format", None)
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": kind}], temperature=0,
                  max_tokens=100, extra_body=body)
    if response_format is not None:
        kwargs["response_format"] = response_format
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    text = choice.message.content
    token_ids = list(text.encode()) + EOS            # the demo tokenizer is byte-level
    check_output(so, token_ids, text, "stop", EOS)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in
                       client.chat.completions.create(stream=True, **kwargs) if chunk.choices)
    assert streamed == text


def test_completions_n4_seeded_all_valid_and_repeatable(server, client):
    so = StructuredOutputsParams(regex=REGEX)
    kwargs = dict(model=server.model, prompt="go", n=4, temperature=1.0, seed=11, max_tokens=20,
                  extra_body={"structured_outputs": {"regex": REGEX}})
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    for c in first.choices:
        token_ids = list(c.text.encode()) + (EOS if c.finish_reason == "stop" else [])
        check_output(so, token_ids, c.text, c.finish_reason, EOS)


def test_completions_stream_with_logprobs_has_no_infinities(server):
    body = {"model": server.model, "prompt": "x", "max_tokens": 8, "temperature": 1.0, "seed": 2, "logprobs": 5,
            "stream": True, "structured_outputs": {"regex": "[ab]{8}"}}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=60) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert set(text) <= {"a", "b"} and len(text) == 8
    for chunk in chunks:
        logprobs = chunk["choices"][0]["logprobs"]
        for top in logprobs["top_logprobs"]:
            assert set(top) <= {"a", "b"}                  # masked tokens are left out of the top lists
        assert all(isinstance(v, float) for v in logprobs["token_logprobs"])


def test_400s_then_healthy_and_serving(server, client):
    bad = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "s",
                                                                    "schema": {"type": "object",
                                                                               "properties": {"foo": "bar"}}}}},
         "response_format.json_schema.schema"),
        ({"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= nothing"}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json": {"type": "object"}, "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}}, "structured_outputs.json"),
        ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
    ]
    for body, param in bad:
        response = httpx.post(server.base_url + "/chat/completions", timeout=30,
                              json={"model": server.model, "messages": [{"role": "user", "content": "x"}], **body})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x"}],
                                       extra_body={"guided_json": {"type": "strin"}})
    ok = client.completions.create(model=server.model, prompt="still fine", max_tokens=3,
                                   extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 3


@pytest.mark.slow
def test_compile_deadline_is_a_400_and_blocks_nobody():
    """A string with maxLength 40 takes seconds to compile against Qwen3's 151k-token vocabulary; with a
    1 s deadline it ends as a 400 while an unconstrained request started beside it completes."""
    args = (shared_path("models/configs/qwen3-tiny"), "--tokenizer", shared_path("models/tokenizers/qwen3"),
            "--load-format", "fake", "--max-model-len", "256", "--grammar-compile-timeout", "1")
    with ServerProcess(*args) as server:
        warm = httpx.post(server.base_url + "/completions", timeout=120,
                          json={"prompt": "warm", "max_tokens": 3, "structured_outputs": {"choice": ["a", "b"]}})
        assert warm.status_code == 200, warm.text                  # loads xgrammar and the vocabulary
        free: dict = {}

        def unconstrained() -> None:
            free["response"] = httpx.post(server.base_url + "/completions", timeout=60,
                                          json={"prompt": "free", "max_tokens": 200, "ignore_eos": True})
            free["done"] = time.monotonic()

        thread = threading.Thread(target=unconstrained)
        start = time.monotonic()
        thread.start()
        slow = httpx.post(server.base_url + "/completions", timeout=60, json={
            "prompt": "slow", "max_tokens": 20,
            "structured_outputs": {"json": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 40}}}}})
        elapsed = time.monotonic() - start
        thread.join(60)
        assert slow.status_code == 400, slow.text
        assert "longer than 1 s" in slow.json()["error"]["message"]
        assert slow.json()["error"]["param"] == "structured_outputs.json"
        assert elapsed < 5
        assert free["response"].status_code == 200
        assert free["response"].json()["usage"]["completion_tokens"] == 200
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
