"""Hostile probes that end or damage their server (kill -9, SIGTERM mid-stream) or need one set up oddly (a
chat template that loops over request data): each starts its own server on the built-in demo model, which
starts in seconds. The probes that share a server are in test_hostile_clients.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.e2e import hostile
from tests.e2e.hostile import JSON
from tests.e2e.server import ServerProcess, descendants, shm_segments

# Repeats each message `repeat` times (chat_template_kwargs): request data drives a loop in the template.
LOOPING_TEMPLATE = ("{% for m in messages %}{% for i in range(repeat | default(1)) %}{{ m['content'] }}{% endfor %}"
                    "\n{% endfor %}{{ 'x' * width | default(0) }}")


@pytest.fixture(scope="module")
def templated():
    with ServerProcess("ringserve-demo", "--max-model-len", "1024", "--chat-template", LOOPING_TEMPLATE) as s:
        yield s


def templated_chat(server: ServerProcess, content: str, **kwargs) -> httpx.Response:
    body = {"model": server.model, "messages": [{"role": "user", "content": content}], "max_tokens": 2,
            "chat_template_kwargs": kwargs}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)


def test_template_overflow_and_runaway_output_are_400(templated):
    """Issue 26.11: an OverflowError in a template (the sandbox's range bound) was a 500, and a template
    could build output without bound from request data."""
    r = templated_chat(templated, "a", repeat=10**9)
    assert r.status_code == 400 and "Range too big" in r.text, r.text
    r = templated_chat(templated, "a", width=10**12)
    assert r.status_code == 400 and "OverflowError" in r.text, r.text
    start = time.monotonic()
    r = templated_chat(templated, "a" * 1000, repeat=100_000)        # 100 MB of prompt, were it rendered
    assert r.status_code == 400 and "characters" in r.text, r.text
    assert time.monotonic() - start < 30
    assert templated_chat(templated, "ab", repeat=2).status_code == 200
    assert httpx.get(templated.url + "/health").status_code == 200


def test_engine_death_is_logged_once_and_the_stats_line_stops():
    """Issue 26.5: after kill -9 of an executor nothing was logged, and the stats line kept printing
    "Running: 8 reqs" every 5 s."""
    before = shm_segments()
    with ServerProcess("ringserve-demo") as s:
        (executor,) = hostile.processes(s, "engine.executor.main")
        body = {"model": s.model, "prompt": "go", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        streams = [threading.Thread(target=lambda: httpx.post(s.base_url + "/completions", json=body, timeout=60))
                   for _ in range(4)]
        # Slowed until the four run together, then stopped: they stay running past the 5 s stats interval.
        with hostile.throttled(executor):
            for t in streams:
                t.start()
            assert hostile.wait_for(lambda: s.metric("num_requests_running") == 4, timeout=60)
        assert hostile.wait_for(lambda: any("Running: 4 reqs" in line for line in s.lines), timeout=15)
        os.kill(executor, signal.SIGKILL)
        assert hostile.wait_for(lambda: httpx.get(s.url + "/health").status_code == 503, timeout=10)
        for t in streams:
            t.join(30)
        time.sleep(6)                                     # past the 5 s stats interval
        engine = descendants(s.proc.pid)
        log = list(s.lines)
    errors = [i for i, line in enumerate(log) if " ERROR " in line]
    assert len(errors) == 1, log[-20:]
    assert f"pid {executor}" in log[errors[0]] and "SIGKILL" in log[errors[0]], log[errors[0]]
    assert not any("Running:" in line for line in log[errors[0]:]), log[errors[0]:]
    assert hostile.wait_for(lambda: not any(map(hostile.alive, engine)), timeout=10)
    assert shm_segments({s.proc.pid, executor, *engine}) - before == set()


def test_sigterm_past_the_timeout_ends_every_stream_with_an_error_event():
    """Issue 26.6: streams still running after --shutdown-timeout were cut at the TCP level (an incomplete
    chunked body) with an asyncio traceback each. Each now gets its API's error event ([DONE] after it for
    OpenAI streams) and the server exits 0 with a clean log."""
    before = shm_segments()
    s = ServerProcess("ringserve-demo", "--shutdown-timeout", "1")
    # Greedy: the Anthropic and Responses APIs have no ignore_eos, and a sampled demo model may say EOS early
    # (from "go" its greedy text runs the full 2,000 tokens).
    long = {"max_tokens": 2000, "ignore_eos": True, "stream": True, "temperature": 0}
    requests = {
        "completions": ("/v1/completions", {"model": s.model, "prompt": "go", **long}),
        "chat": ("/v1/chat/completions", {"model": s.model, "messages": [{"role": "user", "content": "go"}], **long}),
        "messages": ("/v1/messages", {"model": s.model, "messages": [{"role": "user", "content": "go"}],
                                      "max_tokens": 2000, "stream": True, "temperature": 0}),
        "responses": ("/v1/responses", {"model": s.model, "input": "go", "max_output_tokens": 2000, "stream": True,
                                        "temperature": 0}),
    }
    bodies: dict[str, bytes] = {}

    def stream(name: str) -> None:
        path, body = requests[name]
        with httpx.stream("POST", s.url + path, json=body, headers=JSON, timeout=60) as r:
            bodies[name] = b"".join(r.iter_raw())

    try:
        threads = [threading.Thread(target=stream, args=(name,)) for name in requests]
        (executor,) = hostile.processes(s, "engine.executor.main")
        # Slowed until the four run together, then held past the 1 s shutdown timeout whatever the machine's
        # speed: the executor stays stopped until 3 s after SIGTERM.
        with hostile.throttled(executor):
            for t in threads:
                t.start()
            assert hostile.wait_for(lambda: s.metric("num_requests_running") == len(requests), timeout=60)
        engine = descendants(s.proc.pid)
        threading.Timer(3.0, os.kill, (executor, signal.SIGCONT)).start()
        assert s.terminate(timeout=60) == 0
        for t in threads:
            t.join(30)
    finally:
        s.kill()
    assert set(bodies) == set(requests)
    for name in ("completions", "chat"):
        events = [line for line in bodies[name].decode().split("\n\n") if line]
        assert events[-1] == "data: [DONE]", (name, events[-3:])
        error = json.loads(events[-2][len("data: "):])["error"]
        assert "--shutdown-timeout 1 s" in error["message"], error
    assert b"event: error" in bodies["messages"].rsplit(b"\n\n", 2)[-2]
    assert b'"type":"error"' in bodies["responses"].rsplit(b"\n\n", 2)[-2]
    assert not any("Traceback" in line for line in s.lines), "".join(s.lines[-40:])
    assert hostile.wait_for(lambda: not any(map(hostile.alive, engine)), timeout=10)
    assert shm_segments({s.proc.pid, *engine}) - before == set()


def test_nothing_is_left_after_kill_9_of_the_frontend():
    """Every process (scheduler, executors, grammar compile workers) follows the frontend; /dev/shm is clean."""
    before = shm_segments()
    s = ServerProcess("ringserve-demo")
    try:
        body = {"model": s.model, "prompt": "x", "max_tokens": 4, "structured_outputs": {"regex": "[0-9]+"}}
        assert httpx.post(s.base_url + "/completions", json=body, timeout=120).status_code == 200
        engine = descendants(s.proc.pid)
        assert hostile.processes(s, "engine.core.grammar_worker"), "no compile worker to check"
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(10)
    finally:
        s.kill()
    assert hostile.wait_for(lambda: not any(map(hostile.alive, engine)), timeout=15)
    assert shm_segments({s.proc.pid, *engine}) - before == set()
