"""The scheduler's grammar compile pool: a few worker processes (engine/core/grammar_worker.py), a queue of
compiles, and deadlines that really stop a compile.

- Workers start on demand, from the scheduler's main thread (so that PR_SET_PDEATHSIG ties them to the
  scheduler), up to `max_workers`; each has a thread here that feeds it one compile at a time and turns its
  answer into the compile's Future (a `CompiledGrammar`, deserialized against the vocabulary's
  `TokenizerInfo`, which the first worker builds from the tokenizer and later workers are given).
- `stop(future)` ends a compile past its deadline: a queued one is cancelled, a running one's worker is
  killed (its memory goes with it) and replaced when work remains.
- Deadlines run on `clock()`: time during which at least one worker was ready. Time spent before the first
  worker has loaded the tokenizer, or while every worker is restarting after a kill, is not charged to the
  compiles waiting for one; time queued behind other compiles is.
- A worker that cannot serve (no tokenizer, say) says why once; every compile then fails with that reason,
  and no more workers are started.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future

import msgspec

from engine.config import EngineConfig
from engine.core.grammar_worker import Channel, Compile, Compiled, FromWorker, Ready, Setup
from engine.process import describe_exit, spawn
from engine.sampling_params import StructuredOutputsParams

WORKER_MODULE = "engine.core.grammar_worker"


class CompileTask:
    __slots__ = ("spec", "future", "submitted", "clock_at_submit")

    def __init__(self, spec: StructuredOutputsParams, clock: float) -> None:
        self.spec = spec
        self.future: Future = Future()
        self.submitted = time.monotonic()
        self.clock_at_submit = clock


class CompilePool:
    def __init__(self, config: EngineConfig, stop_token_ids: list[int], max_workers: int,
                 worker_module: str = WORKER_MODULE) -> None:
        self._config_json = config.to_json().decode()
        self._stop_token_ids = list(stop_token_ids)
        self._max_workers = max_workers
        self._worker_module = worker_module
        self._workers: list[_Worker] = []
        self._queue: collections.deque[CompileTask] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.setup_error: str | None = None
        self._info = None                    # xgrammar TokenizerInfo, once a worker has built it
        self._info_json: str | None = None
        self._ready_workers = 0
        self._ready_total = 0.0              # seconds with at least one ready worker, up to _ready_since
        self._ready_since: float | None = None

    # ------------------------------------------------------------------ the scheduler's side (main thread)
    def submit(self, spec: StructuredOutputsParams) -> CompileTask:
        task = CompileTask(spec, self.clock())
        with self._cond:
            if self.setup_error is not None:
                task.future.set_exception(ValueError(self.setup_error))
                return task
            self._queue.append(task)
            self._cond.notify()
        self._start_workers()
        return task

    def pending(self) -> int:
        """Compiles queued or running."""
        with self._cond:
            queued = sum(not task.future.done() for task in self._queue)
        return queued + sum(1 for w in self._workers if w.task is not None and not w.task.future.done())

    def clock(self) -> float:
        """Seconds during which at least one worker was ready to compile (the deadlines' clock)."""
        with self._cond:
            since = self._ready_since
            return self._ready_total + (time.monotonic() - since if since is not None else 0.0)

    def stop(self, task: CompileTask) -> None:
        """End a compile: cancel it if queued, kill its worker if running."""
        if task.future.cancel():
            return
        for worker in self._workers:
            if worker.task is task:
                worker.kill()
        self._start_workers()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for worker in self._workers:
            worker.kill()
        for worker in self._workers:
            worker.proc.wait()

    def maintain(self) -> None:
        """Replace workers that died while compiles wait (called from the scheduler's loop)."""
        if any(w.gone for w in self._workers):
            self._start_workers()

    def _start_workers(self) -> None:
        """Enough live workers for the work waiting (at most max_workers); started from this thread only."""
        self._workers = [w for w in self._workers if not w.gone]
        if self.setup_error is not None or self._closed:
            return
        wanted = min(self._max_workers, self.pending())
        while len(self._workers) < wanted:
            proc = spawn(self._worker_module, {"config": self._config_json}, pipes=True)
            worker = _Worker(self, proc)
            self._workers.append(worker)
            worker.thread.start()

    # ------------------------------------------------------------------ the workers' threads
    def _next_task(self) -> CompileTask | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            return None if self._closed else self._queue.popleft()

    def _setup(self) -> Setup:
        with self._cond:
            return Setup(stop_token_ids=self._stop_token_ids, tokenizer_info=self._info_json)

    def _on_ready(self, ready: Ready) -> None:
        import xgrammar as xgr

        with self._cond:
            if ready.tokenizer_info is not None and self._info is None:
                self._info_json = ready.tokenizer_info
                self._info = xgr.TokenizerInfo.deserialize_json(ready.tokenizer_info)
            self._ready_workers += 1
            if self._ready_workers == 1:
                self._ready_since = time.monotonic()

    def _on_gone(self, was_ready: bool) -> None:
        with self._cond:
            if was_ready:
                self._ready_workers -= 1
                if self._ready_workers == 0 and self._ready_since is not None:
                    self._ready_total += time.monotonic() - self._ready_since
                    self._ready_since = None

    def _on_setup_error(self, message: str) -> None:
        with self._cond:
            self.setup_error = message
            failed, self._queue = list(self._queue), collections.deque()
        for task in failed:
            if task.future.set_running_or_notify_cancel():
                task.future.set_exception(ValueError(message))

    def _deserialize(self, grammar_json: str):
        import xgrammar as xgr

        return xgr.CompiledGrammar.deserialize_json(grammar_json, self._info)


class _Worker:
    """One worker process and the thread that talks to it; the thread ends when the process does."""

    def __init__(self, pool: CompilePool, proc) -> None:
        self.pool = pool
        self.proc = proc
        self.task: CompileTask | None = None      # the compile it is running
        self.gone = False
        self.thread = threading.Thread(target=self._run, name=f"ringserve-grammar-{proc.pid}", daemon=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def _run(self) -> None:
        pool = self.pool
        channel = Channel(self.proc.stdout, self.proc.stdin, FromWorker)
        ready = False
        try:
            channel.send(pool._setup())
            reply = channel.receive()
            if reply.error is not None:
                pool._on_setup_error(reply.error)
                return
            pool._on_ready(reply)
            ready = True
            while (task := pool._next_task()) is not None:
                self.task = task                   # before it runs, so that stop() can always find it
                if not task.future.set_running_or_notify_cancel():
                    self.task = None
                    continue
                channel.send(Compile(spec=task.spec))
                reply = channel.receive()
                self.task = None
                if isinstance(reply, Compiled):
                    try:
                        task.future.set_result(pool._deserialize(reply.grammar))
                    except Exception as e:  # noqa: BLE001  handed to the request, never lost
                        task.future.set_exception(ValueError(f"structured_outputs: compile failed: {e}"))
                else:
                    task.future.set_exception(ValueError(reply.message))
        except (EOFError, OSError, msgspec.DecodeError) as e:    # the worker was killed, died, or spoke nonsense
            self.proc.wait()
            how = describe_exit(self.proc, "the grammar compile worker") or str(e)
            task = self.task
            if task is not None and not task.future.done():
                task.future.set_exception(ValueError(f"structured_outputs: compile failed: {how}"))
            elif not ready and not pool._closed:
                pool._on_setup_error(f"structured outputs are unavailable: {how}")
        finally:
            self.gone = True
            pool._on_gone(ready)
            self.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
