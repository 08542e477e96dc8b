"""The engine core: the scheduler loop and the executors it drives.

`EngineCore` is the step logic, independent of where it runs: drain requests, schedule, execute, update,
report. `ExecutorGroup` runs the executors as processes behind the broadcast ring and the per-rank result
rings; `LocalExecutor` runs one model runner in the caller (the in-process mode, for debugging and unit
tests). `main()` is the scheduler process: it attaches the frontend's request and output rings, starts the
executors, completes the startup handshake, and loops until told to stop or a peer dies, in which case it
tells the frontend which process died and how (EngineDead) before it exits.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable

import msgspec

from engine.config import EngineConfig
from engine.executor import make_model_runner, spin_window
from engine.process import child_args, describe_exit, error_text, kill, parent_check, spawn, stop
from engine.protocol import (
    FINISH_ABORT,
    HANDLE,
    AbortRequests,
    AddRequest,
    Codec,
    ControlCall,
    ControlReply,
    EngineDead,
    EngineOut,
    EngineOutputs,
    EngineReady,
    ExecutorCall,
    ExecutorFailed,
    ExecutorIn,
    ExecutorOut,
    ExecutorReady,
    ExecutorReply,
    ModelRunnerOutput,
    RequestIn,
    SchedulerOutput,
    pack,
    unpack,
)
from shm.broadcast import BroadcastRing
from shm.ring import RingSpec, SpscRing
from shm.wait import PeerDiedError

# The scheduler sleeps instead of spinning while it waits for a forward pass expected to take longer.
SLEEP_IF_STEP_LONGER_THAN_US = 4000


def ring_spec_json(spec: RingSpec) -> str:
    return msgspec.json.encode(spec).decode()


def ring_spec_from_json(text: str) -> RingSpec:
    return msgspec.json.decode(text, type=RingSpec)


class ExecutorError(RuntimeError):
    """An executor failed or died; the message says which and how."""


class LocalExecutor:
    """One model runner in the calling process (in-process mode)."""

    def __init__(self, config: EngineConfig) -> None:
        self.runner = make_model_runner(config)
        self.runner.load()
        self.num_blocks = self.runner.available_blocks()
        self.runner.initialize_kv_cache(self.num_blocks)
        self.pids = {"executor0": os.getpid()}

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        return self.runner.execute(so)

    def call(self, method: str, **args) -> str:
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

    def __init__(self, config: EngineConfig, parent_check: Callable[[], None] | None = None) -> None:
        self.config = config
        self.tp = config.tensor_parallel_size
        self.spin_us = spin_window(config)
        self._parent_check = parent_check
        self._in_codec = Codec(ExecutorOut)
        self._out_codec = Codec(ExecutorIn)
        self._call_ids = 0
        self._step_ema_us = 0.0
        self.procs = []
        self.broadcast = BroadcastRing.create(config.ring_bytes, self.tp, spin_us=self.spin_us)
        self.results = [SpscRing.create(config.result_ring_bytes, spin_us=self.spin_us) for _ in range(self.tp)]
        try:
            self._spawn()
            self.num_blocks = self._handshake()
        except BaseException:
            self._close(kill_now=True)
            raise

    def _spawn(self) -> None:
        init_method = None
        if self.tp > 1:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        for rank in range(self.tp):
            self.procs.append(spawn("engine.executor", {
                "config": self.config.to_json().decode(),
                "rank": rank,
                "broadcast": ring_spec_json(self.broadcast.spec),
                "result": ring_spec_json(self.results[rank].spec),
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
            if not isinstance(msg, ExecutorReady):
                raise ExecutorError(f"executor rank {rank} sent {type(msg).__name__} during startup")
            blocks.append(msg.num_blocks)
        self.broadcast.unlink()
        for ring in self.results:
            ring.unlink()
        num_blocks = min(blocks)
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
        self.broadcast.write(self._out_codec.encode(so))
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
        self._close(kill_now=False)

    def _close(self, kill_now: bool) -> None:
        if kill_now:
            kill(self.procs)
        else:
            stop(self.procs, timeout=5.0)
        for ring in (self.broadcast, *self.results):
            ring.unlink()
            ring.close()


class EngineCore:
    """The step loop's logic: the scheduler plus whatever executes the model."""

    def __init__(self, config: EngineConfig, executor) -> None:
        from engine.scheduler import Scheduler

        self.config = config
        self.executor = executor
        self.scheduler = Scheduler(config, executor.num_blocks)
        self.step_count = 0
        self._rejected: list[int] = []

    def handle(self, msg) -> ControlReply | None:
        """Apply one message from the frontend; control calls return their reply."""
        if isinstance(msg, AddRequest):
            try:
                self.scheduler.add_request(msg)
            except ValueError as e:       # the client validates first; this is the last line of defence
                print(f"ringserve: request {msg.req} refused: {e}", file=sys.stderr)
                self._rejected.append(msg.req)
            return None
        if isinstance(msg, AbortRequests):
            self.scheduler.abort_requests(unpack(msg.reqs, HANDLE).tolist())
            return None
        return self.control(msg)

    def control(self, call: ControlCall) -> ControlReply:
        try:
            if call.method == "reset_prefix_cache":
                result = str(self.scheduler.reset_prefix_cache())
            elif call.method in ("start_profile", "stop_profile"):
                result = self.executor.call(call.method, **call.args)
            elif call.method == "shutdown":
                result = "bye"
            else:
                raise ValueError(f"unknown control call {call.method!r}")
            return ControlReply(call_id=call.call_id, ok=True, result=result)
        except ValueError as e:
            return ControlReply(call_id=call.call_id, ok=False, result=str(e))

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return s.has_unfinished_requests() or s.has_pending_outputs()

    def take_rejected(self) -> EngineOutputs | None:
        """Requests the scheduler refused, reported as aborted so that nobody waits for them."""
        if not self._rejected:
            return None
        rejected, self._rejected = self._rejected, []
        return EngineOutputs(
            reqs=b"", new_token_ids=b"", finished_reqs=pack(rejected, HANDLE),
            finish_reasons=bytes([FINISH_ABORT] * len(rejected)), stop_reasons=[None] * len(rejected),
            first_scheduled=[], logprobs=[], prompt_logprobs=[], timestamp=time.monotonic(),
            stats=self.scheduler.make_stats(),
        )

    def step(self) -> EngineOutputs | None:
        so = self.scheduler.schedule()
        self.step_count += 1
        result = None
        if so.total_num_scheduled_tokens or len(so.finished_reqs) or so.new_reqs:
            result = self.executor.execute(so)
        outputs = self.scheduler.update_from_output(so, result)
        if len(outputs.reqs) or len(outputs.finished_reqs) or outputs.first_scheduled or outputs.prompt_logprobs:
            return outputs
        return None


# ----------------------------------------------------------------------------- the scheduler process
def main() -> int:
    args = child_args()
    config = EngineConfig.from_json(args["config"])
    requests = SpscRing.attach(ring_spec_from_json(args["request_ring"]), spin_us=0)
    outputs = SpscRing.attach(ring_spec_from_json(args["output_ring"]), spin_us=0)
    check_parent = parent_check(args["parent_pid"], "the frontend")
    requests.set_peer_check(check_parent)
    outputs.set_peer_check(check_parent)
    codec_out = Codec(EngineOut)
    executors = None
    try:
        executors = ExecutorGroup(config, parent_check=check_parent)
        requests.set_peer_check(executors.check)
        outputs.set_peer_check(executors.check)
        core = EngineCore(config, executors)
        gc.collect()
        gc.freeze()        # the block pool's objects live forever: keep them out of every GC pass
        outputs.write(codec_out.encode(EngineReady(
            num_blocks=executors.num_blocks, block_size=config.block_size,
            max_model_len=config.max_model_len, pids={"scheduler": os.getpid(), **executors.pids},
        )))
        _loop(core, requests, outputs, codec_out)
        executors.shutdown()
        return 0
    except BaseException as e:  # noqa: BLE001  whatever happened, the frontend must learn it
        if isinstance(e, PeerDiedError) and "frontend" in str(e):
            message = None                         # nobody left to tell
        elif isinstance(e, (PeerDiedError, ExecutorError)):
            message = str(e)
        else:
            message = f"the scheduler failed: {error_text(e)}"
        if message is not None:
            try:
                outputs.write(codec_out.encode(EngineDead(message=message)), timeout=2.0)
            except Exception:  # noqa: BLE001
                print(message, file=sys.stderr)
        if executors is not None:
            executors._close(kill_now=True)
        return 1
    finally:
        requests.close()
        outputs.close()


def _loop(core: EngineCore, requests: SpscRing, outputs: SpscRing, codec_out: Codec) -> None:
    codec_in = Codec(RequestIn)
    while True:
        if not core.has_work:
            requests.wait_readable(timeout=None)
        while (data := requests.try_read()) is not None:
            msg = codec_in.decode(data)
            reply = core.handle(msg)
            if reply is not None:
                outputs.write(codec_out.encode(reply))
                if msg.method == "shutdown":
                    return
        rejected = core.take_rejected()
        if rejected is not None:
            outputs.write(codec_out.encode(rejected))
        if core.has_work:
            step_outputs = core.step()
            if step_outputs is not None:
                outputs.write(codec_out.encode(step_outputs))


if __name__ == "__main__":
    sys.exit(main())
