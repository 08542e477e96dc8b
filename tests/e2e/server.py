"""Starting the real `ringserve serve` as a subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from engine.process import children, descendants  # noqa: F401  (the e2e tests' names for them)
from tests.conftest import REPO


def shm_segments(pids=None) -> set[str]:
    """ringserve's segments in /dev/shm; with `pids`, only those these processes created (a segment is named
    ringserve-<creator pid>-<random>), so that a test's leak check does not see other servers on the machine."""
    names = {n for n in os.listdir("/dev/shm") if "ringserve" in n}
    if pids is None:
        return names
    wanted = {str(pid) for pid in pids}
    return {n for n in names if len(n.split("-")) >= 3 and n.split("-")[-2] in wanted}


SERVING = re.compile(r"serving (\S+) on (http://\S+)")


class ServerProcess:
    """`python -m frontend.cli serve ARGS --port 0`; waits for the 'serving ... on URL' line."""

    def __init__(self, *args: str, startup_timeout: float = 120.0, env: dict | None = None) -> None:
        full_env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frontend.cli", "serve", *args, "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
        )
        self.lines: list[str] = []
        self.url: str | None = None
        ready = threading.Event()

        def pump() -> None:
            for line in self.proc.stdout:
                self.lines.append(line)
                match = SERVING.search(line)
                if match and self.url is None:
                    self.model, self.url = match.group(1), match.group(2)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(startup_timeout) or self.url is None:
            self.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines[-40:]))
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the server never became healthy:\n" + "".join(self.lines[-40:]))

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def descendants(self) -> list[int]:
        """The scheduler (our child) and the executors (its children), from /proc."""
        return descendants(self.proc.pid)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(f"ringserve:{name}{{") or line.startswith(f"ringserve:{name} "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
