"""`ringserve serve -dp 2 --load-format fake`: two engine cores behind one frontend, end to end.

Which engine served a request is read from the per-engine prefix-cache counters in /metrics (every prompt
token is looked up once, on the engine that runs it)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import threading
import time

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.block_hash import external_block_hash, prefix_block_hashes
from engine.core.kv_events import END_SEQ, BlockRemoved, BlockStored, KVEventBatch
from tests.e2e.server import ServerProcess, children, descendants, shm_segments
from tests.e2e.test_server import gone

PREFIX = "You are a careful assistant. Answer in one line, cite nothing, and keep it short. " * 2   # 170 bytes


def per_engine(server: ServerProcess, name: str) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"ringserve:{name}":
                out[sample.labels["engine"]] = sample.value
    return out


def complete(server: ServerProcess, prompt: str, headers: dict | None = None, max_tokens: int = 4) -> httpx.Response:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(server.base_url + "/completions", json=body, headers=headers or {}, timeout=60)


def queries_delta(server: ServerProcess, send) -> dict[str, float]:
    before = per_engine(server, "prefix_cache_queries_total")
    send()
    after = per_engine(server, "prefix_cache_queries_total")
    return {engine: after[engine] - before.get(engine, 0) for engine in after}


@pytest.fixture(scope="module")
def kv_events_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kv-events")


@pytest.fixture(scope="module")
def server(kv_events_dir):
    events = []
    if importlib.util.find_spec("zmq") is not None:
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{kv_events_dir}/pub",
                  "replay_endpoint": f"ipc://{kv_events_dir}/replay"}
        events = ["--kv-events-config", json.dumps(config)]
    with ServerProcess("ringserve-demo", "-dp", "2", "--load-format", "fake", *events) as s:
        yield s


def test_two_engines_start_and_report_themselves(server):
    assert len(children(server.proc.pid)) == 2                       # one scheduler per rank
    info = per_engine(server, "cache_config_info")
    assert set(info) == {"0", "1"}
    assert set(per_engine(server, "num_requests_running")) == {"0", "1"}


def test_concurrent_requests_all_complete_on_both_engines(server):
    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async def one(i: int) -> dict:
                body = {"model": server.model, "prompt": f"distinct prompt number {i} " * 3, "max_tokens": 8 + i % 3,
                        "ignore_eos": True}
                return (await client.post("/completions", json=body)).json()
            return await asyncio.gather(*(one(i) for i in range(24)))

    results: list[dict] = []
    delta = queries_delta(server, lambda: results.extend(asyncio.run(run())))
    assert [r["usage"]["completion_tokens"] for r in results] == [8 + i % 3 for i in range(24)]
    assert delta["0"] > 0 and delta["1"] > 0, delta                  # both engines worked


def test_the_same_prefix_lands_on_the_same_engine(server):
    for group in range(4):
        prompts = [f"{group}-{PREFIX}question {i}?" for i in range(5)]
        delta = queries_delta(server, lambda ps=prompts: [complete(server, p).raise_for_status() for p in ps])
        used = [engine for engine, d in delta.items() if d]
        assert len(used) == 1, (group, delta)
    hits = per_engine(server, "prefix_cache_hits_total")
    assert sum(hits.values()) >= 4 * 4 * (len(PREFIX) // 16) * 16         # every follower hit the prefix


def test_pinned_ranks_are_honoured_and_bad_pins_are_400(server):
    for rank in ("0", "1", "1", "0"):
        pin = {"X-data-parallel-rank": rank}
        finished = per_engine(server, "generation_tokens_total")
        delta = queries_delta(server, lambda pin=pin: complete(server, PREFIX, pin).raise_for_status())
        assert delta[rank] > 0 and delta[str(1 - int(rank))] == 0, (rank, delta)
        # the frontend's own series name the engine that served the request too
        after = per_engine(server, "generation_tokens_total")
        assert after[rank] - finished[rank] == 4 and after[str(1 - int(rank))] == finished[str(1 - int(rank))]
    for bad in ("2", "-1", "one"):
        r = complete(server, "x", {"X-data-parallel-rank": bad})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "X-data-parallel-rank"
    assert httpx.get(server.url + "/health").status_code == 200


def replay_all(endpoint: str) -> list[KVEventBatch]:
    """Every batch a rank has published so far, from its replay socket."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(endpoint)
        sock.send_multipart((b"", (0).to_bytes(8, "big")))
        batches = []
        while sock.poll(5000):
            _, seq, payload = sock.recv_multipart()
            if seq == END_SEQ:
                return batches
            batches.append(msgspec.msgpack.decode(payload, type=KVEventBatch))
        raise AssertionError(f"no end of replay from {endpoint}")
    finally:
        sock.close(linger=0)
        ctx.term()


def test_each_engine_publishes_kv_events_for_the_blocks_it_caches(server, kv_events_dir):
    pytest.importorskip("zmq")
    prompt = "kv events pinned to rank one. " * 8
    assert complete(server, prompt, {"X-data-parallel-rank": "1"}).status_code == 200
    tokens = httpx.post(server.url + "/tokenize", json={"model": server.model, "prompt": prompt}).json()["tokens"]
    blocks = {external_block_hash(h) for h in prefix_block_hashes(tokens, 16)}
    cached = []
    for rank, suffix in enumerate(("", "_dp1")):
        batches = replay_all(f"ipc://{kv_events_dir}/replay{suffix}")
        assert batches and all(b.data_parallel_rank == rank for b in batches)
        stored = set()
        for batch in batches:
            for event in batch.events:
                if isinstance(event, BlockStored):
                    stored.update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    stored.difference_update(event.block_hashes)
        cached.append(stored)
    assert blocks and blocks <= cached[1] and not blocks & cached[0]


def scheduler_of_rank(server_pid: int, rank: int) -> int:
    for pid in children(server_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = json.loads(f.read().split(b"\0")[3])
        if json.loads(args["config"])["data_parallel_rank"] == rank:
            return pid
    raise AssertionError(f"no scheduler for rank {rank}")


def test_sigkill_of_one_engine_fails_its_requests_fast_and_leaves_nothing_behind():
    before = shm_segments()
    with ServerProcess("ringserve-demo", "-dp", "2", "--load-format", "fake") as s:
        victim = scheduler_of_rank(s.proc.pid, 0)
        victim_executors = descendants(victim)
        outcome: dict[str, list[str]] = {}

        def stream(rank: str, max_tokens: int) -> None:
            body = {"model": s.model, "prompt": "x", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", s.base_url + "/completions", json=body, timeout=60,
                              headers={"X-data-parallel-rank": rank}) as r:
                outcome[rank] = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        outcome[rank].append(line[6:])
                        if len(outcome[rank]) == 1:
                            started[rank].set()

        started = {"0": threading.Event(), "1": threading.Event()}
        workers = [threading.Thread(target=stream, args=("0", 1500)), threading.Thread(target=stream, args=("1", 400))]
        for w in workers:
            w.start()
        assert started["0"].wait(30) and started["1"].wait(30)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        workers[0].join(10)
        failed_after = time.monotonic() - killed_at
        workers[1].join(60)
        assert not workers[0].is_alive() and not workers[1].is_alive()
        assert failed_after < 2.0, failed_after
        assert outcome["0"][-1] == "[DONE]"
        error = json.loads(outcome["0"][-2])["error"]
        assert "data-parallel engine 0" in error["message"] and "SIGKILL" in error["message"], error
        assert outcome["1"][-1] == "[DONE]"                   # the other engine's request was not touched
        assert all("error" not in json.loads(e) for e in outcome["1"][:-1])
        health = httpx.get(s.url + "/health")
        assert health.status_code == 503 and "data-parallel engine 0" in health.text
        assert gone(victim_executors)                          # the dead engine's executors did not linger
        engine = descendants(s.proc.pid)
        assert s.terminate(timeout=60) == 0
        assert gone(engine)
    assert shm_segments({s.proc.pid, victim, *victim_executors, *engine}) - before == set()
