"""Fixtures of the shm tests: a private name prefix that must leave /dev/shm clean, and peer processes."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from shm.segment import SHM_DIR, unlink_segment, unlink_semaphore
from tests.conftest import REPO


def entries_of(prefix: str) -> list[str]:
    """The /dev/shm entries (segments and sem.* semaphores) whose name starts with `prefix`-."""
    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith((f"{prefix}-", f"sem.{prefix}-")))


@pytest.fixture
def prefix():
    """A name prefix of this test alone (helpers share /dev/shm); the test must leave nothing under it."""
    name = f"rstest{secrets.token_hex(4)}"
    yield name
    leaked = entries_of(name)
    for entry in leaked:
        if entry.startswith("sem."):
            unlink_semaphore("/" + entry[4:])
        else:
            unlink_segment("/" + entry)
    assert not leaked, f"/dev/shm entries leaked: {leaked}"


@pytest.fixture
def spawn():
    """Start `python -m tests.shm.ring_worker ROLE ...` (spawned, never forked); killed at teardown."""
    procs: list[subprocess.Popen] = []

    def start(role: str, *args: str | int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "tests.shm.ring_worker", role, "--parent", str(os.getpid())]
        proc = subprocess.Popen(
            cmd + [str(a) for a in args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
