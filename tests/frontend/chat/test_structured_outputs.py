"""Structured outputs at the API (over the FakeEngine): every user-caused failure is a 400 naming the field,
the constraint reaches the engine in SamplingParams.structured_outputs with vLLM's names whatever field it
came in, and a grammar that fails in the engine is a 400 (or, once streaming, an in-band error)."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.outputs import RequestDelta
from tests.frontend.harness import serve_fake
from tests.frontend.openai.test_validation import CHAT, COMPLETIONS, USER, assert_error

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
DEEP = {"type": "integer"}
for _ in range(40):
    DEEP = {"items": DEEP}


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"foo": "bar"}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "structural_tag"}}, "response_format.format"),
    ({"structured_outputs": {"regex": "(?<=a)b"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"grammar": "start: WORD"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": {"type": "object"}, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": [str(i) for i in range(300)]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": {"type": "object", "description": "x" * 40000}}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": DEEP}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": "{bad"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " *"}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"regex": "a", "backend": "outlines"}}, "structured_outputs.backend"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "guided_regex"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"guided_json": {"type": "strin"}}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["x"]}, "guided_choice"),
    ({"guided_regex": "a", "guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
    ({"guided_regex": "a", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_structured_output_errors_are_400s_naming_the_field(http, path, body, param):
    request = {"messages": USER, **body} if path == CHAT else {"prompt": "x", **body}
    assert_error(http.post(path, json=request), 400, param)
    assert http.get("/health").status_code == 200


def test_the_server_stays_healthy_after_the_400s(http):
    for body in ({"structured_outputs": {"regex": "(?<=a)b"}}, {"guided_json": "{"}):
        assert http.post(COMPLETIONS, json={"prompt": "x", **body}).status_code == 400
    assert http.get("/health").status_code == 200
    ok = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("body,expected", [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}},
     {"json": SCHEMA}),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
     {"json": SCHEMA, "disable_any_whitespace": True}),
    ({"structured_outputs": {"choice": ["a", "b"]}}, {"choice": ["a", "b"]}),
    ({"structured_outputs": {"grammar": 'root ::= "x"'}}, {"grammar": 'root ::= "x"'}),
    ({"structured_outputs": {"json_object": True}}, {"json_object": True}),
    ({"guided_json": json.dumps(SCHEMA)}, {"json": json.dumps(SCHEMA)}),
    ({"guided_regex": "[ab]+", "guided_decoding_backend": "xgrammar"}, {"regex": "[ab]+"}),
    ({"guided_choice": ["y", "n"]}, {"choice": ["y", "n"]}),
    ({"guided_grammar": 'root ::= "x"'}, {"grammar": 'root ::= "x"'}),
    ({"response_format": {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}},
     {"structural_tag": {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}}),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"disable_any_whitespace": True}},
     {"json_object": True, "disable_any_whitespace": True}),
    ({"guided_json": SCHEMA, "structured_outputs": {"disable_additional_properties": True}},
     {"json": SCHEMA, "disable_additional_properties": True}),
])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_every_source_reaches_the_engine_as_structured_outputs(served, http, path, body, expected):
    _, fake = served
    request = {"messages": USER} if path == CHAT else {"prompt": "x"}
    response = http.post(path, json={**request, **body, "max_tokens": 2, "n": 2})
    assert response.status_code == 200, response.text
    submitted = [params.structured_outputs for _, _, params in fake.submitted[-2:]]
    for so in submitted:
        if expected is None:
            assert so is None
            continue
        for name, value in expected.items():
            assert getattr(so, name) == value
        assert so.kind == next(iter(expected))


@pytest.fixture
def failing_engine(tiny_model):
    """A fake engine whose structured requests fail in the engine, after `tokens_first` tokens."""
    server, fake = serve_fake(tiny_model)
    original = fake.generate
    state = {"tokens_first": 0}

    async def generate(request_id, prompt, params, **kwargs):
        if params.structured_outputs is None:
            async for delta in original(request_id, prompt, params, **kwargs):
                yield delta
            return
        if state["tokens_first"]:
            yield RequestDelta(request_id, [5] * state["tokens_first"])
        yield RequestDelta(request_id, [], finished=True, finish_reason="error",
                           error="structured_outputs: compiling the grammar took longer than 1 s")

    fake.generate = generate
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield http, state


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_side_grammar_failure_is_a_400_naming_the_field(failing_engine, stream):
    http, _ = failing_engine
    body = {"messages": USER, "stream": stream, "response_format": {"type": "json_object"}}
    error = assert_error(http.post(CHAT, json=body), 400, "response_format")
    assert "took longer than" in error["message"]
    body = {"prompt": "x", "stream": stream, "structured_outputs": {"regex": "a+"}}
    assert_error(http.post(COMPLETIONS, json=body), 400, "structured_outputs.regex")
    ok = http.post(COMPLETIONS, json={"prompt": "x", "max_tokens": 2, "stream": stream})
    assert ok.status_code == 200


def test_a_failure_after_tokens_were_streamed_is_an_in_band_error(failing_engine):
    http, state = failing_engine
    state["tokens_first"] = 3
    response = http.post(COMPLETIONS, json={"prompt": "x", "stream": True, "structured_outputs": {"regex": "a+"}})
    assert response.status_code == 200
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 400 and "took longer than" in error["message"]
    assert any(json.loads(e).get("choices") for e in events[:-2])
