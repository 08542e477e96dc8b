"""Waiting on a ring: spin briefly, then sleep on a POSIX semaphore behind an eventcount; watch the peer.

The eventcount keeps the fast path free of system calls. A side about to sleep bumps its *announce word* in
shared memory, re-checks the ring, then sleeps on its semaphore; the other side, after publishing a counter,
compares the announce word with the last value it answered and posts only when it changed. Both sides put a
full fence between their store and their load (Dekker's pattern), so at least one of them sees the other.
Every sleep is a bounded slice followed by a re-check, so even a lost post costs one slice, never a hang, and
every blocking wait calls the peer check at least every PEER_CHECK_INTERVAL_S.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import posix_ipc

SLEEP_SLICE_S = 0.05
# The first microseconds of a spin poll without yielding: a yield costs ~1 us and, on a loaded machine, can
# hand the core to another process for a whole time slice, while a peer's answer often takes a few us.
# The price: two peers squeezed onto one core delay each other by up to this much per hand-over.
POLL_S = 20e-6
PEER_CHECK_INTERVAL_S = 0.1
_HANDLER_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM,
                    signal.SIGVTALRM, signal.SIGPROF, signal.SIGUSR1, signal.SIGUSR2)


class PeerDiedError(RuntimeError):
    """The process on the other side of a ring is dead; the message says which one and how it ended."""


def wait_until(
    ready: Callable[[], bool],
    announce: Callable[[], None],
    sem: posix_ipc.Semaphore,
    deadline: float | None,
    spin_us: int,
    peer_check: Callable[[], None] | None,
) -> bool:
    """Wait until `ready()`; False once time.monotonic() passes `deadline` (None: no deadline).

    Spins for `spin_us` microseconds (after the first POLL_S yielding the core between checks), then
    announces itself (the caller's `announce` bumps its word and fences) and sleeps on `sem` in slices of at
    most SLEEP_SLICE_S, calling `peer_check` every PEER_CHECK_INTERVAL_S.
    """
    clock = time.monotonic
    now = clock()
    next_peer_check = now + PEER_CHECK_INTERVAL_S
    spin_end = now + spin_us * 1e-6
    if deadline is not None and deadline < spin_end:
        spin_end = deadline
    yield_after = now + POLL_S
    yield_core = os.sched_yield
    while True:
        if ready():
            return True
        now = clock()
        if now >= spin_end:
            break
        if now >= yield_after:
            if peer_check is not None and now >= next_peer_check:
                peer_check()
                next_peer_check = now + PEER_CHECK_INTERVAL_S
            yield_core()
    held_signals = None             # looked up at the first sleep: the spin path never needs it
    while True:
        announce()
        if ready():
            return True
        now = clock()
        if deadline is not None and now >= deadline:
            return False
        if peer_check is not None and now >= next_peer_check:
            peer_check()
            next_peer_check = now + PEER_CHECK_INTERVAL_S
        nap = SLEEP_SLICE_S if deadline is None else min(SLEEP_SLICE_S, deadline - now)
        if peer_check is not None:
            nap = min(nap, next_peer_check - now)
        if held_signals is None:
            held_signals = _signals_to_hold()
        if held_signals:
            _sleep_with_signals_held(sem, nap, held_signals)
        else:
            try:
                sem.acquire(nap)
            except (posix_ipc.BusyError, posix_ipc.SignalError):
                pass    # KeyboardInterrupt, the only exception a handler here can raise, gets through


def _signals_to_hold() -> frozenset[int]:
    """The signals whose Python handlers may raise what posix_ipc would drop.

    posix_ipc runs the Python handler of a signal that interrupts acquire() and then raises SignalError in
    place of whatever the handler raised; only KeyboardInterrupt gets through. So a SystemExit from a
    SIGTERM handler, or pytest-timeout's failure from SIGALRM, would be lost and the wait would go on.
    Python runs handlers only in the main thread, so other threads hold nothing. Looked up once per wait
    (a few getsignal calls), and only for the signals programs put such handlers on.
    """
    if threading.current_thread() is not threading.main_thread():
        return frozenset()
    return frozenset(
        signum for signum in _HANDLER_SIGNALS
        if callable(handler := signal.getsignal(signum)) and handler is not signal.default_int_handler
    )


def _sleep_with_signals_held(sem: posix_ipc.Semaphore, nap: float, signals: frozenset[int]) -> None:
    """sem.acquire(nap) with `signals` held back: they are delivered when the mask is restored, and their
    handlers run and raise as usual, at most one slice late.

    The mask is read before it is changed: CPython runs pending handlers right after pthread_sigmask changes
    the mask, so a signal that arrived just before the block raises from that very call, after the block;
    were `previous` its result, the signals would stay blocked for good (and be inherited by every child
    process started from this thread)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        sem.acquire(nap)
    except posix_ipc.BusyError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

# ----------------------------------------------------------------------------- peer liveness
def describe_exit(pid: int, name: str, returncode: int) -> str:
    """'<name> (pid N) was killed by signal SIGKILL' or '<name> (pid N) exited with code 3'."""
    if returncode < 0:
        return f"{name} (pid {pid}) was killed by signal {_signal_name(-returncode)}"
    return f"{name} (pid {pid}) exited with code {returncode}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"{signum}"


def popen_check(popen: subprocess.Popen, name: str) -> Callable[[], None]:
    """A peer check for a child started with subprocess: raises PeerDiedError once it has exited."""

    def check() -> None:
        returncode = popen.poll()
        if returncode is not None:
            raise PeerDiedError(describe_exit(popen.pid, name, returncode))

    return check


def pid_check(pid: int, name: str) -> Callable[[], None]:
    """A peer check for any process by pid (a parent, a sibling): raises PeerDiedError once it is dead.

    Zombies count as dead. The process's start time is recorded now, so a pid reused by a new process after
    the peer died is not mistaken for the peer. For our own children the exit status is read without reaping
    them (waitid with WNOWAIT), so a Popen that owns the child still sees its return code.
    """
    start_time = _start_time(pid)

    def check() -> None:
        returncode = _child_returncode(pid)
        if returncode is not None:
            raise PeerDiedError(describe_exit(pid, name, returncode))
        if start_time is None or _start_time(pid) != start_time:
            raise PeerDiedError(f"{name} (pid {pid}) is gone")

    return check


def pid_alive(pid: int) -> bool:
    """True while `pid` names a live process (a zombie is dead); True too for another user's process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _start_time(pid) is not None or not os.path.isdir("/proc")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: the fields after it start at the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _child_returncode(pid: int) -> int | None:
    """The exit status of our own child `pid` once it has ended (without reaping it); None otherwise."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status
