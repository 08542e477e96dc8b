"""Raw HTTP: SSE framing, client disconnects (streaming or not) abort the engine request, engine death."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.frontend.harness import serve_fake


def sse_events(response: httpx.Response) -> list[bytes]:
    """The data payloads of an SSE body, checking the framing: 'data: ...' lines, each followed by a blank."""
    lines = response.read().split(b"\n")
    assert lines[-2:] == [b"", b""]          # the body ends with the last event's blank line
    events = []
    for i in range(0, len(lines) - 1, 2):
        assert lines[i].startswith(b"data: "), lines[i]
        assert lines[i + 1] == b""
        events.append(lines[i][len(b"data: "):])
    return events


def wait_for(predicate, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def running_metric(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("ringserve:num_requests_running{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("num_requests_running missing from /metrics")


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
])
def test_sse_framing_one_finish_per_choice_done_last(http, path, body):
    with http.stream("POST", path, json={**body, "max_tokens": 6, "n": 3, "stream": True,
                                         "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
    chunks = [orjson.loads(e) for e in events[:-1]]
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"])
                for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [(0, "length"), (1, "length"), (2, "length")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 18


@pytest.fixture(scope="module")
def slow(tiny_model):
    """A server whose engine takes 10 ms a step: requests take seconds unless aborted."""
    server, fake = serve_fake(tiny_model, step_delay=0.01)
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield server, fake, http


def test_disconnect_mid_stream_aborts_the_request(slow):
    server, fake, http = slow
    with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 400, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.call(lambda: len(fake.running)) == 1
        request_id = server.call(lambda: next(iter(fake.running)))
    # leaving the block closes the connection mid-stream
    assert wait_for(lambda: request_id in server.call(lambda: list(fake.aborted)))
    assert wait_for(lambda: running_metric(http) == 0)
    assert 'finished_reason="abort"' in http.get("/metrics").text


def test_disconnect_while_waiting_for_a_full_response_aborts_it(slow):
    server, fake, http = slow
    aborted_before = server.call(lambda: len(fake.aborted))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", timeout=0.3,
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 400})
    assert wait_for(lambda: server.call(lambda: len(fake.aborted)) == aborted_before + 1)
    assert wait_for(lambda: running_metric(http) == 0)


def test_disconnect_aborts_every_choice_of_n(slow):
    server, fake, http = slow
    aborted_before = server.call(lambda: len(fake.aborted))
    with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 400, "n": 4,
                                                      "stream": True}) as r:
        next(r.iter_lines())
    assert wait_for(lambda: server.call(lambda: len(fake.aborted)) == aborted_before + 4)
    assert wait_for(lambda: running_metric(http) == 0)


def test_engine_death_mid_stream(tiny_model):
    server, fake = serve_fake(tiny_model, step_delay=0.01)
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/health").status_code == 200
        with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 400, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            server.call(fake.die)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        error = orjson.loads(rest[-2][len("data: "):])["error"]
        assert error["code"] == 503 and "executor 0 died" in error["message"]
        health = http.get("/health")
        assert health.status_code == 503 and "executor 0 died" in health.json()["error"]["message"]
        refused = http.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "ServiceUnavailableError"
