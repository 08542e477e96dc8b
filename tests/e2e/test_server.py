"""End to end: the real `ringserve serve` process (frontend, scheduler and executor processes over the shm
rings) on a free loopback port, driven by the official `openai` client and raw httpx."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.conftest import shared_path
from tests.e2e.server import ServerProcess, descendants, shm_segments


def gone(pids, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in pids):
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.fixture(scope="module")
def server():
    with ServerProcess("ringserve-demo") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused")


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# ----------------------------------------------------------------------------- the openai client
def test_completion_counts_tokens_and_echoes(server, client):
    r = client.completions.create(model=server.model, prompt="Hello", max_tokens=7, temperature=0,
                                  echo=True, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens == len(b"Hello")   # byte-level tokens
    assert r.choices[0].text.startswith("Hello")


def test_chat_streams_with_usage(server, client):
    stream = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_n_seeds_and_logprobs(server, client):
    kw = dict(model=server.model, prompt="abc", max_tokens=12, temperature=1.0, extra_body={"ignore_eos": True})
    a = client.completions.create(seed=42, n=2, **kw)
    b = client.completions.create(seed=42, n=2, **kw)
    c = client.completions.create(seed=7, n=2, **kw)
    assert sorted(ch.index for ch in a.choices) == [0, 1]
    assert [ch.text for ch in a.choices] == [ch.text for ch in b.choices]
    assert [ch.text for ch in a.choices] != [ch.text for ch in c.choices]
    assert a.choices[0].text != a.choices[1].text                 # children get distinct seeds
    lp = client.completions.create(logprobs=2, **kw).choices[0].logprobs
    assert len(lp.tokens) == 12 and all(len(top) >= 1 for top in lp.top_logprobs)
    assert all(value <= 0 for value in lp.token_logprobs)


def test_stop_string_cuts_the_greedy_output(server, client):
    kw = dict(model=server.model, prompt="The stop test", max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    stop = text[3:5]
    assert len(stop) == 2
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_real_tokenizers_render_their_chat_templates(family, tmp_path):
    """A tiny dummy-weight model with the real vocabulary, served with the real tokenizer."""
    from transformers import AutoTokenizer

    tokenizer_dir = shared_path("models", "tokenizers", family)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    arch, model_type = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama3": ("LlamaForCausalLM", "llama")}[family]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": [arch], "model_type": model_type, "vocab_size": len(tokenizer),
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024, "torch_dtype": "float32",
        "tie_word_embeddings": True, "rope_theta": 10000.0}))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, wörld 🌍"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = tokenizer.encode(text, add_special_tokens=False)
    with ServerProcess(str(tmp_path), "--tokenizer", str(tokenizer_dir), "--load-format", "dummy") as s:
        client = openai.OpenAI(base_url=s.base_url, api_key="unused")
        r = client.chat.completions.create(model=s.model, messages=messages, max_tokens=4,
                                           extra_body={"ignore_eos": True})
        tokens = httpx.post(s.url + "/tokenize", json={"model": s.model, "messages": messages}).json()
    assert r.usage.prompt_tokens == len(expected)
    assert tokens["tokens"] == list(expected)


# ----------------------------------------------------------------------------- raw HTTP
def test_sse_framing(server):
    body = {"model": server.model, "prompt": "x", "max_tokens": 5, "stream": True, "n": 2, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [(0, "length"), (1, "length")]


def test_invalid_requests_get_openai_errors_and_the_server_stays_up(server):
    url = server.base_url + "/completions"
    cases = [
        ({"model": server.model, "prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"model": server.model, "prompt": "x" * 3000, "max_tokens": 10}, 400, None),
        ({"model": server.model, "prompt": ""}, 400, "prompt"),
        ({"model": "no-such-model", "prompt": "x"}, 404, "model"),
    ]
    for body, status, param in cases:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}
        if param:
            assert error["param"] == param
    for junk in ['{"model": 3}', "[]", "nul", '{"prompt": {"a": [[[[[]]]]]}}', '{"max_tokens": 1e400}']:
        assert httpx.post(url, content=junk, headers={"content-type": "application/json"}).status_code == 400
    assert httpx.get(server.url + "/health").status_code == 200


def test_64_concurrent_streams_complete_with_their_token_counts(server):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int, bool]:
        body = {"model": server.model, "prompt": f"request {i}", "max_tokens": 16 + i % 5, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        tokens, done, usage = 0, False, None
        async with client.stream("POST", "/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
        tokens = usage["completion_tokens"] if usage else -1
        return 16 + i % 5, tokens, done

    async def run():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    results = asyncio.run(run())
    assert all(done and want == got for want, got, done in results), results


def test_disconnect_mid_stream_frees_the_request(server):
    body = {"model": server.model, "prompt": "long", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(5):
            next(lines)
        assert server.metric("num_requests_running") == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (server.metric("num_requests_running") or
                                           server.metric("kv_cache_usage_perc")):
        time.sleep(0.05)
    assert server.metric("num_requests_running") == 0
    assert server.metric("kv_cache_usage_perc") == 0


# ----------------------------------------------------------------------------- faults and shutdown
def test_sigkill_of_the_scheduler_ends_streams_with_an_error_and_health_503():
    before = shm_segments()
    with ServerProcess("ringserve-demo") as s:
        scheduler = min(descendants(s.proc.pid))                 # our direct child
        body = {"model": s.model, "prompt": "x", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", s.base_url + "/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(lines)
            engine = descendants(s.proc.pid)
            os.kill(scheduler, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert "error" in json.loads(rest[-2][6:])
        assert httpx.get(s.url + "/health").status_code == 503
        assert gone(engine)
    assert shm_segments({s.proc.pid, *engine}) - before == set()


def test_sigterm_lets_in_flight_requests_finish_then_exits_0():
    before = shm_segments()
    s = ServerProcess("ringserve-demo", "--shutdown-timeout", "30")
    results = []

    def stream(i: int) -> None:
        body = {"model": s.model, "prompt": f"p{i}", "max_tokens": 200, "ignore_eos": True}
        results.append(httpx.post(s.base_url + "/completions", json=body, timeout=60).json())

    try:
        workers = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and s.metric("num_requests_running") < 4:
            time.sleep(0.01)
        engine = descendants(s.proc.pid)
        assert s.terminate(timeout=60) == 0
        for w in workers:
            w.join(10)
    finally:
        s.kill()
    assert [r["usage"]["completion_tokens"] for r in results] == [200] * 4
    assert gone(engine)
    assert shm_segments({s.proc.pid, *engine}) - before == set()


def test_profiling_writes_the_executor_trace_and_request_events(tmp_path):
    with ServerProcess("ringserve-demo", "--profile-dir", str(tmp_path)) as s:
        assert httpx.post(s.url + "/start_profile", timeout=60).status_code == 200
        body = {"model": s.model, "prompt": "profile me", "max_tokens": 8, "ignore_eos": True}
        assert httpx.post(s.base_url + "/completions", json=body, timeout=60).status_code == 200
        assert httpx.post(s.url + "/stop_profile", timeout=120).status_code == 200
    traces = list(tmp_path.glob("trace-rank0-*.json"))
    assert len(traces) == 1 and "traceEvents" in traces[0].read_text()
    events = [json.loads(line) for f in tmp_path.glob("frontend-requests-*.jsonl") for line in f.read_text().splitlines()]
    assert events[0]["event"] == "profile_start" and events[-1]["event"] == "profile_stop"
    assert len(events) > 2                              # the request's own events are in between
