"""The scheduler's handle on the executors: the driver side of the broadcast ring and the result rings.

`Executor` is what `EngineCore` drives. `ExecutorGroup` runs the executor processes (`engine.executor.main`,
the other end of the same rings, in this package) and completes the startup handshake: every rank reports
how many KV blocks fit (ExecutorReady), all are told the minimum. `LocalExecutor` runs one model runner in
the calling process (the in-process mode, for debugging and unit tests).

This module runs in the scheduler process and imports no torch at module level.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from engine.config import EngineConfig
from engine.errors import ExecutorError
from engine.messages import (
    Codec,
    ExecutorCall,
    ExecutorFailed,
    ExecutorIn,
    ExecutorLoading,
    ExecutorOut,
    ExecutorReady,
    ExecutorReply,
    ModelRunnerOutput,
    SchedulerOutput,
)
from engine.process import describe_exit, kill, spawn, stop
from shm.broadcast import BroadcastRing
from shm.ring import SpscRing
from shm.wait import PeerDiedError

# The scheduler sleeps instead of spinning while it waits for a forward pass expected to take longer.
SLEEP_IF_STEP_LONGER_THAN_US = 4000


class Executor(Protocol):
    """What EngineCore needs from whatever runs the model."""

    num_blocks: int
    weight_bytes: dict[str, int]           # by GGUF block type or dtype, every rank's together

    @property
    def pids(self) -> dict[str, int]: ...

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        """Run one step; None when the step schedules no tokens."""

    def submit(self, so: SchedulerOutput) -> None:
        """Start one step without waiting for it (async scheduling); collect(so) returns its result."""

    def collect(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        """The result of the oldest submitted step, which must be `so`."""

    def call(self, method: str, **args) -> str:
        """A control call on every rank (start_profile, stop_profile, ...); rank 0's reply."""

    def check(self) -> None:
        """Raise PeerDiedError when an executor died."""

    def shutdown(self) -> None: ...


def make_model_runner(config: EngineConfig, rank: int = 0, tp_size: int = 1):
    """The model runner for config.load_format and config.runner; the fake one imports no torch and starts in
    a blink."""
    if config.load_format == "fake":
        from engine.executor.fake_runner import FakeModelRunner

        return FakeModelRunner(config, rank, tp_size)
    if config.runner == "pooling":
        from engine.executor.pooling_runner import EncoderModelRunner, PoolingModelRunner

        return (EncoderModelRunner if config.is_encoder else PoolingModelRunner)(config, rank, tp_size)
    from engine.executor.model_runner import ModelRunner

    return ModelRunner(config, rank, tp_size)



class LocalExecutor:
    """One model runner in the calling process (in-process mode)."""

    def __init__(self, config: EngineConfig) -> None:
        self.runner = make_model_runner(config)
        self.runner.load()
        self.num_blocks = self.runner.available_blocks()
        self.weight_bytes = self.runner.weight_bytes()
        self.runner.initialize_kv_cache(self.num_blocks)
        self._results: deque[ModelRunnerOutput | None] = deque()

    @property
    def pids(self) -> dict[str, int]:
        return {"executor0": os.getpid()}

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        return self.runner.execute(so)

    def submit(self, so: SchedulerOutput) -> None:
        self._results.append(self.runner.execute(so))      # one process: nothing to overlap with

    def collect(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        return self._results.popleft()

    def call(self, method: str, **args) -> str:
        if method == "sleep":
            return self.runner.sleep(int(args["level"]))
        if method == "wake_up":
            return self.runner.wake_up()
        if method == "start_profile":
            return self.runner.start_profile(str(args["dir"]))
        if method == "stop_profile":
            return self.runner.stop_profile()
        raise ValueError(f"unknown executor call {method!r}")

    def check(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class ExecutorGroup:
    """The executor processes, the broadcast ring to them and one result ring from each."""

    def __init__(self, config: EngineConfig, parent_check: Callable[[], None] | None = None,
                 on_progress: Callable[[str, int, int], None] | None = None) -> None:
        self.config = config
        self.tp = config.tensor_parallel_size
        self.spin_us = config.spin_window_us
        self._parent_check = parent_check
        self._on_progress = on_progress          # (stage, done, total) while the executors start
        self._in_codec = Codec(ExecutorOut)
        self._out_codec = Codec(ExecutorIn)
        self._call_ids = 0
        self._step_ema_us = 0.0
        self.procs = []
        self.broadcast = BroadcastRing.create(config.ring_bytes, self.tp, spin_us=self.spin_us)
        self.results = [SpscRing.create(config.result_ring_bytes, spin_us=self.spin_us) for _ in range(self.tp)]
        self.weight_bytes: dict[str, int] = {}
        try:
            self._spawn()
            self.num_blocks = self._handshake()
        except BaseException:
            self.close(kill_now=True)
            raise

    def _spawn(self) -> None:
        init_method = None
        if self.tp > 1:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        for rank in range(self.tp):
            self.procs.append(spawn("engine.executor.main", {
                "config": self.config.to_json().decode(),
                "rank": rank,
                "broadcast": self.broadcast.spec.to_json().decode(),
                "result": self.results[rank].spec.to_json().decode(),
                "dist_init_method": init_method,
            }))
        self.broadcast.set_peer_check(self.check)
        for ring in self.results:
            ring.set_peer_check(self.check)

    def _handshake(self) -> int:
        """Every rank reports its KV capacity (or its failure); all get the minimum; rank 0 confirms."""
        blocks = []
        deadline = time.monotonic() + self.config.startup_timeout_s
        for rank, ring in enumerate(self.results):
            msg = self._read(ring, timeout=max(deadline - time.monotonic(), 0.1))
            while isinstance(msg, ExecutorLoading):
                if self._on_progress is not None:
                    self._on_progress("weights", msg.done, msg.total)
                msg = self._read(ring, timeout=max(deadline - time.monotonic(), 0.1))
            if not isinstance(msg, ExecutorReady):
                raise ExecutorError(f"executor rank {rank} sent {type(msg).__name__} during startup")
            blocks.append(msg.num_blocks)
            for kind, count in msg.weight_bytes.items():
                self.weight_bytes[kind] = self.weight_bytes.get(kind, 0) + count
        self.broadcast.unlink()
        for ring in self.results:
            ring.unlink()
        num_blocks = min(blocks)
        if self._on_progress is not None:
            self._on_progress("kv_cache", 0, 0)
        self.call("initialize", timeout=self.config.startup_timeout_s, num_blocks=num_blocks)
        return num_blocks

    @property
    def pids(self) -> dict[str, int]:
        return {f"executor{rank}": p.pid for rank, p in enumerate(self.procs)}

    def check(self) -> None:
        """Raises PeerDiedError when an executor died (or our parent did)."""
        for rank, proc in enumerate(self.procs):
            how = describe_exit(proc, f"executor rank {rank}")
            if how is not None:
                raise PeerDiedError(self._failure_text(rank) or how)
        if self._parent_check is not None:
            self._parent_check()

    def _failure_text(self, rank: int) -> str | None:
        """An executor that failed (rather than was killed) left its error on its result ring."""
        try:
            data = self.results[rank].try_read()
        except Exception:  # noqa: BLE001  best effort while reporting another failure
            return None
        if data is None:
            return None
        msg = self._in_codec.decode(data)
        return f"executor rank {rank} failed: {msg.message}" if isinstance(msg, ExecutorFailed) else None

    def _read(self, ring: SpscRing, timeout: float | None = None, spin_us: int | None = None):
        with ring.read_view(timeout=timeout, spin_us=spin_us) as view:
            msg = self._in_codec.decode(view)
        if isinstance(msg, ExecutorFailed):
            raise ExecutorError(f"executor rank {msg.rank} failed: {msg.message}")
        return msg

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        self.submit(so)
        return self.collect(so)

    def submit(self, so: SchedulerOutput) -> None:
        self.broadcast.write(self._out_codec.encode(so))

    def collect(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        if so.total_num_scheduled_tokens == 0:
            return None
        start = time.perf_counter()
        spin = 0 if self._step_ema_us > SLEEP_IF_STEP_LONGER_THAN_US else None
        msg = self._read(self.results[0], spin_us=spin)
        self._step_ema_us = 0.8 * self._step_ema_us + 0.2 * (time.perf_counter() - start) * 1e6
        if not isinstance(msg, ModelRunnerOutput) or msg.step != so.step:
            raise ExecutorError(f"executor rank 0 answered step {so.step} with {msg!r:.200}")
        return msg

    def call(self, method: str, timeout: float | None = 60.0, **args) -> str:
        self._call_ids += 1
        self.broadcast.write(self._out_codec.encode(ExecutorCall(call_id=self._call_ids, method=method,
                                                                 args=args)))
        msg = self._read(self.results[0], timeout=timeout)
        if not isinstance(msg, ExecutorReply) or msg.call_id != self._call_ids:
            raise ExecutorError(f"executor rank 0 answered call {method!r} with {msg!r:.200}")
        return msg.result

    def shutdown(self) -> None:
        try:
            self.call("shutdown", timeout=5.0)
        except Exception:  # noqa: BLE001  shutting down regardless
            pass
        self.close(kill_now=False)

    def close(self, kill_now: bool) -> None:
        """Stop the executors (SIGKILL at once when kill_now) and release the rings."""
        if kill_now:
            kill(self.procs)
        else:
            stop(self.procs, timeout=5.0)
        for ring in (self.broadcast, *self.results):
            ring.unlink()
            ring.close()
