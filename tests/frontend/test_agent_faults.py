"""Faults in the agent APIs' streams: a client that leaves mid-stream aborts its engine request, and an
engine that dies mid-stream ends the stream with an in-band error in the API's own shape."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.frontend.harness import serve_fake

MESSAGES = ("/v1/messages", {"model": "tiny", "max_tokens": 400, "stream": True,
                             "messages": [{"role": "user", "content": "x"}]})
RESPONSES = ("/v1/responses", {"model": "tiny", "max_output_tokens": 400, "stream": True, "input": "x"})


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("path,body", [MESSAGES, RESPONSES], ids=["messages", "responses"])
def test_disconnect_mid_stream_aborts_the_request(tiny_model, path, body):
    server, fake = serve_fake(tiny_model, step_delay=0.01)
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("POST", path, json=body) as response:
            lines = response.iter_lines()      # kept: a dropped line iterator closes the response
            assert next(lines).startswith("event: ")
            assert wait_for(lambda: server.call(lambda: len(fake.running)) == 1)
            request_id = server.call(lambda: next(iter(fake.running)))
        assert wait_for(lambda: request_id in server.call(lambda: list(fake.aborted)))
        assert server.call(lambda: len(fake.running)) == 0


@pytest.mark.parametrize("path,body", [MESSAGES, RESPONSES], ids=["messages", "responses"])
def test_engine_death_mid_stream_is_an_in_band_error(tiny_model, path, body):
    server, fake = serve_fake(tiny_model, step_delay=0.01)
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        with http.stream("POST", path, json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("event: ")
            assert wait_for(lambda: server.call(lambda: len(fake.running)) == 1)
            server.call(fake.die)
            rest = [line for line in lines if line]
        assert rest[-2] == "event: error"
        error = json.loads(rest[-1][len("data: "):])
        if path == "/v1/messages":
            assert error == {"type": "error", "error": {
                "type": "overloaded_error", "message": "the engine is not running: executor 0 died (killed by signal 9)"}}
        else:
            assert error["type"] == "error" and error["code"] == "503" and "executor 0 died" in error["message"]
        refused = http.post(path, json={**body, "stream": False})
        assert refused.status_code == 503
        shape = refused.json()
        assert shape["error"]["type"] == ("overloaded_error" if path == "/v1/messages" else "ServiceUnavailableError")
