"""GET /openapi.json: it documents every route, and schemathesis fuzzing against it (valid and invalid
requests, bounded, loopback only) gets no 5xx and no response that breaks the document; the server is
healthy afterwards."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance
from starlette.routing import Route

from frontend.openapi import OPERATIONS, operations

# Bounded: hypothesis-jsonschema takes ~1 s per Messages example, and the whole fuzz stays under a minute.
EXAMPLES = {GenerationMode.POSITIVE: 8, GenerationMode.NEGATIVE: 5}
WITH_BODY = {(op.method, op.path) for op in OPERATIONS if op.request is not None}
CHECKS = [not_a_server_error, response_schema_conformance, negative_data_rejection]


def test_every_route_is_documented(served, http):
    server, _ = served
    routes = {(method, route.path) for route in server.app.routes if isinstance(route, Route)
              for method in route.methods - {"HEAD"}}
    documented = {(op.method, op.path) for op in operations(web_ui=True)}
    assert routes == documented
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops} == documented
    # request bodies are the msgspec types the handlers decode with
    body = doc["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/MessagesRequest"}
    assert set(doc["components"]["schemas"]["MessagesRequest"]["required"]) == {"model", "messages", "max_tokens"}


@pytest.fixture(scope="module")
def schema(served):
    server, _ = served
    return schemathesis.openapi.from_dict(httpx.get(server.url + "/openapi.json").json())


def _operations(schema):
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_fuzzing_finds_no_server_error_and_no_off_schema_response(served, schema, http, mode):
    server, _ = served
    fuzzed = 0
    for operation in _operations(schema):
        if operation.path in ("/start_profile", "/stop_profile", "/models/unload", "/sleep", "/wake_up"):
            continue        # they change the server's state (tested on their own)
        if mode is GenerationMode.NEGATIVE and (operation.method.upper(), operation.path) not in WITH_BODY:
            continue        # no body, and any string is a valid response id: nothing to negate

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES[mode], deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call(base_url=server.url, timeout=30)
            case.validate_response(response, checks=CHECKS)

        run()
        fuzzed += 1
    assert fuzzed >= (31 if mode is GenerationMode.POSITIVE else 16)
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 3,
                                         "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
