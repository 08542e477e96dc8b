"""launch_server as a real process: it reports its port, drains on SIGTERM, aborts what outlives the
shutdown timeout, stops the engine and exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from frontend.config import ServerConfig
from frontend.server import launch_server
from tests.conftest import REPO
from tests.frontend.fake_engine import FakeEngine
from tests.frontend.harness import engine_config


class ServerProcess:
    def __init__(self, model_dir, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.frontend.fake_server_main", str(model_dir), *args],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self._port = threading.Event()
        self.url = ""
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._port.wait(60):
            self.proc.kill()
            raise AssertionError("the server never said where it listens:\n" + "".join(self.log))

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            match = re.search(r"serving tiny on (http://[\d.]+:\d+)", line)
            if match:
                self.url = match.group(1)
                self._port.set()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> tuple[int, dict]:
        self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def start_server(tiny_model):
    started = []

    def start(*args: str) -> ServerProcess:
        started.append(ServerProcess(tiny_model, *args))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def test_sigterm_drains_in_flight_requests_then_exits_0(start_server):
    server = start_server("--step-delay", "0.01", "--shutdown-timeout", "10")
    with httpx.Client(base_url=server.url, timeout=20) as http:
        assert http.get("/health").status_code == 200
        with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 60, "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in rest[-2]
    out, _ = server.proc.communicate(timeout=15)
    report = json.loads(out.strip().splitlines()[-1])
    assert server.proc.returncode == 0
    assert report["started"] and report["shut_down"] and report["aborted"] == []


def test_requests_outliving_the_shutdown_timeout_are_aborted(start_server):
    """(SIGINT here: Ctrl-C takes the same path as SIGTERM.)"""
    server = start_server("--step-delay", "0.01", "--shutdown-timeout", "0.5")
    with httpx.Client(base_url=server.url, timeout=20) as http:
        with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 500, "stream": True}) as r:
            next(r.iter_lines())
            began = time.monotonic()
            code, report = server.stop(signal.SIGINT)
            elapsed = time.monotonic() - began
    assert code == 0
    assert len(report["aborted"]) == 1 and report["shut_down"]
    assert elapsed < 5



class StartFails(FakeEngine):
    def start(self) -> None:
        raise RuntimeError("executor 0 failed: weights not found")


class StartHangs(FakeEngine):
    def start(self) -> None:
        time.sleep(60)


def in_process_config(fake: FakeEngine) -> ServerConfig:
    return ServerConfig(port=0, log_stats_interval=0, engine=fake.config)


def test_engine_start_failure_is_raised_with_its_message(tiny_model):
    fake = StartFails(engine_config(tiny_model))
    backstop = threading.Timer(10, os.kill, (os.getpid(), signal.SIGTERM))   # a hang ends, and fails
    backstop.start()
    try:
        with pytest.raises(RuntimeError, match="executor 0 failed: weights not found"):
            launch_server(in_process_config(fake), engine_client=fake)
    finally:
        backstop.cancel()
    assert fake.shut_down


def test_sigterm_while_the_engine_starts_stops_the_server(tiny_model):
    fake = StartHangs(engine_config(tiny_model))
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    began = time.monotonic()
    timer.start()
    try:
        launch_server(in_process_config(fake), engine_client=fake)
    finally:
        timer.cancel()
    assert time.monotonic() - began < 5
    assert fake.shut_down and not fake.started
