"""Peer checks (how a dead process is named) and the spin-then-sleep wait."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import posix_ipc
import pytest

from shm.wait import PeerDiedError, pid_alive, pid_check, popen_check, wait_until


def _python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_dead(proc: subprocess.Popen) -> None:
    """Wait until the child has exited, leaving it a zombie (not reaped)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError("child did not exit")


def test_popen_check_names_the_signal_and_the_exit_code():
    killed = subprocess.Popen(["sleep", "30"])
    check = popen_check(killed, "executor 0")
    check()  # alive: no error
    killed.kill()
    killed.wait()
    with pytest.raises(PeerDiedError, match=rf"^executor 0 \(pid {killed.pid}\) was killed by signal SIGKILL$"):
        check()
    exited = _python("raise SystemExit(3)")
    exited.wait()
    with pytest.raises(PeerDiedError, match=rf"^scheduler \(pid {exited.pid}\) exited with code 3$"):
        popen_check(exited, "scheduler")()


def test_pid_check_sees_a_zombie_child_without_reaping_it():
    child = _python("raise SystemExit(3)")
    check = pid_check(child.pid, "frontend")
    _wait_dead(child)
    with pytest.raises(PeerDiedError, match=rf"frontend \(pid {child.pid}\) exited with code 3"):
        check()
    assert child.wait(timeout=5) == 3  # Popen still gets the status: waitid(WNOWAIT) did not reap


def test_pid_check_of_a_live_process_passes_and_of_a_gone_one_raises():
    proc = subprocess.Popen(["sleep", "30"])
    check = pid_check(proc.pid, "peer")
    check()
    assert pid_alive(proc.pid)
    proc.kill()
    proc.wait()  # reaped: the pid now names nothing (or, much later, someone else)
    with pytest.raises(PeerDiedError, match=rf"peer \(pid {proc.pid}\) is gone"):
        check()
    assert not pid_alive(proc.pid)


def test_pid_check_of_a_pid_that_never_lived():
    with pytest.raises(PeerDiedError, match="is gone"):
        pid_check(999_999_999, "ghost")()


@pytest.fixture
def sem():
    sem = posix_ipc.Semaphore(None, posix_ipc.O_CREX)  # a random name
    sem.unlink()
    yield sem
    sem.close()


def test_wait_until_times_out_after_sleeping(sem):
    announced = []
    cpu = time.thread_time()
    start = time.monotonic()
    assert not wait_until(lambda: False, lambda: announced.append(1), sem, start + 0.3, 1000, None)
    assert 0.28 < time.monotonic() - start < 1.0
    assert len(announced) >= 3  # it slept in slices, re-announcing each time
    assert time.thread_time() - cpu < 0.05


def test_wait_until_returns_when_ready_during_the_spin(sem):
    calls = []

    def ready():
        calls.append(1)
        return len(calls) == 5

    assert wait_until(ready, lambda: pytest.fail("slept"), sem, None, 1_000_000, None)


def test_wait_until_is_woken_by_a_post(sem, monkeypatch):
    monkeypatch.setattr("shm.wait.SLEEP_SLICE_S", 5.0)
    published = threading.Event()

    def peer():
        time.sleep(0.2)
        published.set()
        sem.release()

    thread = threading.Thread(target=peer)
    thread.start()
    start = time.monotonic()
    assert wait_until(published.is_set, lambda: None, sem, start + 10, 0, None) is True
    assert time.monotonic() - start < 1.0  # the post, not the 5 s slice
    thread.join()


def test_an_exception_from_a_signal_handler_ends_the_wait(sem):
    """posix_ipc swallows what a signal handler raises while acquire() sleeps (it raises SignalError
    instead); the wait must let it through (pytest-timeout and SIGTERM handlers rely on it)."""
    import signal

    class Alarm(Exception):
        pass

    def handler(signum, frame):
        raise Alarm

    previous = signal.signal(signal.SIGALRM, handler)
    start = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Alarm):
            wait_until(lambda: False, lambda: None, sem, start + 5.0, 0, None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 1.0


def test_a_handler_raising_as_the_signals_are_held_leaves_the_mask_as_it_was(sem, monkeypatch):
    """CPython runs a pending handler right after pthread_sigmask blocks: its exception must not leave the
    held signals blocked (they would stay so for the thread and every process it starts)."""
    import signal

    from shm import wait

    class Alarm(Exception):
        pass

    real = signal.pthread_sigmask

    def block_then_raise(how, signals):
        previous = real(how, signals)
        if how == signal.SIG_BLOCK and signal.SIGALRM in set(signals):
            raise Alarm                              # as a handler of a signal pending at the block would
        return previous

    monkeypatch.setattr(wait.signal, "pthread_sigmask", block_then_raise)
    before = real(signal.SIG_BLOCK, ())
    with pytest.raises(Alarm):
        wait._sleep_with_signals_held(sem, 0.01, frozenset({signal.SIGALRM}))
    assert real(signal.SIG_BLOCK, ()) == before
