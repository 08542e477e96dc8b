"""The documented deployment past one engine: two unmodified `ringserve serve` replicas behind vllm-router
(cache_aware policy) on loopback. Optional: skipped unless the vllm-router command is installed (the PyPI
wheel `vllm-router`; not a ringserve dependency) or RINGSERVE_VLLM_ROUTER names it."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import string
import subprocess
import time

import httpx
import openai
import pytest

from tests.e2e.server import ServerProcess
from tests.e2e.test_data_parallel import per_engine

ROUTER = os.environ.get("RINGSERVE_VLLM_ROUTER") or shutil.which("vllm-router")
pytestmark = pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed (pip install vllm-router)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deployment():
    with ServerProcess("ringserve-demo", "--load-format", "fake") as a, \
            ServerProcess("ringserve-demo", "--load-format", "fake") as b:
        port = free_port()
        router = subprocess.Popen(
            [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", a.url, b.url,
             "--policy", "cache_aware", "--health-check-interval-secs", "1", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert router.poll() is None, "vllm-router exited"
                time.sleep(0.2)
            else:
                pytest.fail("vllm-router did not come up")
            yield url, a, b
        finally:
            router.terminate()
            router.wait(10)


def test_the_openai_api_works_through_the_router(deployment):
    url, a, _ = deployment
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    assert client.models.list().data[0].id == a.model
    r = client.completions.create(model=a.model, prompt="Hello", max_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    body = {"model": a.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert any(json.loads(e)["choices"] and json.loads(e)["choices"][0]["finish_reason"] == "length"
               for e in events[:-1])


def test_cache_aware_routing_keeps_each_prefix_on_one_replica(deployment):
    url, a, b = deployment

    def queries() -> list[float]:
        return [per_engine(s, "prefix_cache_queries_total")["0"] for s in (a, b)]

    for group in range(6):
        rng = random.Random(group)
        prefix = " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(40))
        before = queries()
        for i in range(4):
            body = {"model": a.model, "prompt": f"{prefix} question {i}", "max_tokens": 2, "ignore_eos": True}
            assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
        delta = [after - b4 for after, b4 in zip(queries(), before, strict=True)]
        assert sum(1 for d in delta if d) == 1, (group, delta)
    # (which replica a new prefix goes to is vllm-router's choice: at this low load it may keep them all on
    # one; its cache_aware policy balances only past --balance-abs-threshold queued requests)
    hits = sum(per_engine(s, "prefix_cache_hits_total")["0"] for s in (a, b))
    assert hits >= 6 * 3 * 16 * 16                         # 3 followers per group reuse >= 16 blocks
