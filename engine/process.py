"""Starting and watching the engine's processes.

Children are started with subprocess (fork + exec: spawn semantics, safe after CUDA init) as
`python -m <module> <json>`: their whole configuration travels as one JSON argument, so nothing is pickled.
A child asks the kernel to SIGKILL it when its parent dies (PR_SET_PDEATHSIG) when the parent spawned it
from its main thread (the signal is tied to the spawning *thread*), and every child also checks in its
bounded waits that its parent is still the one that started it; so no crash of any process leaves an
orphan running.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

from engine.config import LOG_FORMAT
from shm.wait import PeerDiedError

PR_SET_PDEATHSIG = 1
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spawn(module: str, args: dict, env: dict[str, str] | None = None, pipes: bool = False) -> subprocess.Popen:
    """Start `python -m module` with `args` (JSON-encodable) as its single argument; `env` adds to (or
    overrides) the environment it inherits (CUDA_VISIBLE_DEVICES for a data-parallel rank); `pipes`: talk to
    it over its stdin and stdout (binary pipes) instead of shared memory."""
    args = dict(args, parent_pid=os.getpid(),
                pdeathsig=threading.current_thread() is threading.main_thread())
    env = dict(os.environ, **(env or {}))
    path = env.get("PYTHONPATH", "")
    if _REPO_ROOT not in path.split(os.pathsep):
        env["PYTHONPATH"] = _REPO_ROOT + (os.pathsep + path if path else "")
    return subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(args)],
        stdin=subprocess.PIPE if pipes else subprocess.DEVNULL, stdout=subprocess.PIPE if pipes else None,
        env=env, close_fds=True,
    )


def child_args() -> dict:
    """In a child: read its arguments and tie its life to its parent's."""
    args = json.loads(sys.argv[1])
    if args.get("pdeathsig"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != args["parent_pid"]:        # the parent died before prctl took effect
        os._exit(1)
    return args


def configure_logging(level: str) -> None:
    """A child's log lines (its startup notes, chiefly) go to the stderr it shares with the frontend, in the
    frontend's format and at its level (EngineConfig.log_level)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def parent_check(parent_pid: int, name: str) -> Callable[[], None]:
    """A peer check for a child: raises PeerDiedError once the parent is gone (we were re-parented)."""
    def check() -> None:
        if os.getppid() != parent_pid:
            raise PeerDiedError(f"{name} (pid {parent_pid}) is gone")
    return check


def describe_exit(popen: subprocess.Popen, name: str) -> str | None:
    """None while the process runs, else how it ended."""
    code = popen.poll()
    if code is None:
        return None
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = str(-code)
        return f"{name} (pid {popen.pid}) was killed by signal {sig}"
    return f"{name} (pid {popen.pid}) exited with code {code}"


def stop(popens: list[subprocess.Popen], timeout: float = 5.0) -> None:
    """Wait for processes to exit, then SIGKILL what is left; always reaps."""
    for p in popens:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def kill(popens: list[subprocess.Popen]) -> None:
    for p in popens:
        if p.poll() is None:
            p.kill()
    for p in popens:
        p.wait()


def children(pid: int) -> list[int]:
    """The live (not zombie) child processes of `pid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (a server's scheduler and executors), from /proc."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """The original error and where it came from, short enough for one message."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]
