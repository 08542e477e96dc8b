"""--idle-unload on a real server: after a request loads a model and the model sits idle, its engine stops:
no scheduler or executor process remains, no /dev/shm entry is left, and the server's memory is back within
150 MB of what it was before the load (its tokenizer goes with the engine). The slow test repeats load and
unload 200 times (a fake-weight model, so each start is quick) and checks the same: nothing accumulates."""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from engine.models.demo import ensure_demo_model
from tests.e2e.hostile import wait_for
from tests.e2e.models_dir import make_models_dir
from tests.e2e.server import ServerProcess, shm_segments

IDLE_S = 2.0
RSS_MARGIN = 150 << 20


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = make_models_dir(tmp_path_factory.mktemp("models"), qwen3=False)
    fake = directory / "fake"                  # the demo's shapes, fake weights: an engine starts in a blink
    shutil.copytree(ensure_demo_model(), fake)
    (fake / "ringserve.toml").write_text('load_format = "fake"\n')
    return directory


@pytest.fixture(scope="module")
def server(models):
    with ServerProcess("--models-dir", str(models), "--idle-unload", str(IDLE_S), startup_timeout=300) as s:
        yield s


def test_an_idle_model_is_unloaded_with_nothing_left_behind(server):
    name = "smol" if "smol" in server.model.split(",") else "demo-a"
    time.sleep(1.0)                                   # the server settles after its ready line
    before_rss, before_shm = rss(server.proc.pid), shm_segments()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        reply = http.post("/v1/chat/completions", json={"model": name, "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200 and server.descendants()
        def state() -> str:
            return next(m for m in http.get("/v1/models").json()["data"] if m["id"] == name)["status"]["value"]

        assert wait_for(lambda: state() == "unloaded", IDLE_S + 30), state()
        assert wait_for(lambda: not server.descendants(), 10), server.descendants()
    assert shm_segments() - before_shm == set()
    grown = rss(server.proc.pid) - before_rss
    assert grown < RSS_MARGIN, f"the server's RSS grew by {grown >> 20} MiB over a load and idle unload"
    assert "unloaded (idle)" in "".join(server.lines)


@pytest.mark.slow
def test_two_hundred_load_unload_cycles_leak_nothing(server):
    before_shm = shm_segments()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        http.post("/models/load", json={"model": "fake"})
        http.post("/models/unload", json={"model": "fake"})
        assert wait_for(lambda: not server.descendants(), 30)
        before_rss, before_fds = rss(server.proc.pid), len(os.listdir(f"/proc/{server.proc.pid}/fd"))
        for i in range(200):
            assert http.post("/models/load", json={"model": "fake"}).status_code == 200, i
            assert http.post("/v1/completions", json={"model": "fake", "prompt": "x", "max_tokens": 2}).status_code == 200
            assert http.post("/models/unload", json={"model": "fake"}).status_code == 200, i
        assert wait_for(lambda: not server.descendants(), 30), server.descendants()
        loads = next(m for m in http.get("/v1/models").json()["data"] if m["id"] == "fake")
    assert loads["status"]["value"] == "unloaded"
    assert shm_segments() - before_shm == set()
    assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) <= before_fds + 2
    grown = rss(server.proc.pid) - before_rss
    assert grown < 64 << 20, f"the server's RSS grew by {grown >> 20} MiB over 200 cycles"
