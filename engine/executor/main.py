"""The executor process: one per rank. Reads SchedulerOutputs from the broadcast ring, runs the model
runner, and (rank 0 only) writes the results to its result ring.

Startup: attach the rings, load the weights, report how many KV blocks fit (ExecutorReady), then wait for
the scheduler's "initialize" call with the minimum over all ranks. Any exception is reported on the rank's
result ring as ExecutorFailed with the original error text, then the process exits.
"""

from __future__ import annotations

import os
import sys

from engine.config import EngineConfig
from engine.executor.group import make_model_runner
from engine.messages import (
    Codec,
    ExecutorCall,
    ExecutorFailed,
    ExecutorIn,
    ExecutorLoading,
    ExecutorOut,
    ExecutorReady,
    ExecutorReply,
    SchedulerOutput,
)
from engine.process import child_args, configure_logging, error_text, parent_check
from shm.broadcast import BroadcastRing
from shm.ring import RingSpec, SpscRing
from shm.wait import PeerDiedError


def main() -> int:
    args = child_args()
    config = EngineConfig.from_json(args["config"])
    configure_logging(config.log_level)
    rank, tp = args["rank"], config.tensor_parallel_size
    spin = config.spin_window_us
    broadcast = BroadcastRing.attach(RingSpec.from_json(args["broadcast"]), rank, spin_us=spin)
    result = SpscRing.attach(RingSpec.from_json(args["result"]), spin_us=spin)
    check = parent_check(args["parent_pid"], "the scheduler")
    broadcast.set_peer_check(check)
    result.set_peer_check(check)
    out_codec = Codec(ExecutorOut)
    try:
        def report(done: int, total: int) -> None:
            result.write(out_codec.encode(ExecutorLoading(rank=rank, done=done, total=total)))

        runner = _start(config, rank, tp, args, report if rank == 0 else None)
        result.write(out_codec.encode(ExecutorReady(rank=rank, num_blocks=runner.available_blocks(),
                                                    pid=os.getpid(), weight_bytes=runner.weight_bytes())))
        _serve(runner, rank, broadcast, result, out_codec)
        return 0
    except PeerDiedError:
        return 1                                   # the scheduler is gone; nobody to tell
    except BaseException as e:  # noqa: BLE001  every failure must reach the scheduler with its text
        try:
            result.write(out_codec.encode(ExecutorFailed(rank=rank, message=error_text(e))), timeout=2.0)
        except Exception:  # noqa: BLE001  the ring itself may be what failed
            print(error_text(e), file=sys.stderr)
        return 1
    finally:
        broadcast.close()
        result.close()


def _start(config: EngineConfig, rank: int, tp: int, args: dict, report):
    if config.load_format == "fake":
        runner = make_model_runner(config, rank, tp)
        runner.load()
        return runner
    if config.resolved_device == "cpu" and config.runner == "pooling":
        # Read by OpenMP as torch loads it. A pooling step is a burst of short parallel torch ops beside a busy
        # HTTP frontend: threads that spin at each barrier while their peer is descheduled cost 5-13x the
        # requests/s on a shared 2-core machine (docs/performance.md); sleeping at once costs microseconds.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    if config.resolved_device == "cpu":
        from engine.executor.cpu_memory import reuse_freed_memory

        torch.set_num_threads(config.executor_threads)
        reuse_freed_memory()
    else:
        torch.cuda.set_device(rank)                  # before NCCL init: one GPU per rank
    if tp > 1:
        from engine.distributed import init_tensor_parallel

        backend = "nccl" if config.resolved_device == "cuda" else "gloo"
        init_tensor_parallel(rank, tp, args["dist_init_method"], backend)
    torch.manual_seed(config.seed)
    runner = make_model_runner(config, rank, tp)
    runner.report_progress = report
    runner.load()
    runner.report_progress = None        # a wake from sleep level 2 reloads quietly: the ring carries steps
    return runner


def _serve(runner, rank: int, broadcast: BroadcastRing, result: SpscRing, out_codec: Codec) -> None:
    in_codec = Codec(ExecutorIn)
    reply_to_scheduler = rank == 0
    while True:
        with broadcast.read_view() as view:
            msg = in_codec.decode(view)
        if isinstance(msg, SchedulerOutput):
            output = runner.execute(msg)
            if reply_to_scheduler and output is not None:
                result.write(out_codec.encode(output))
            continue
        assert isinstance(msg, ExecutorCall)
        text = _call(runner, msg)
        if reply_to_scheduler:
            result.write(out_codec.encode(ExecutorReply(call_id=msg.call_id, ok=True, result=text)))
        if msg.method == "shutdown":
            return


def _call(runner, call: ExecutorCall) -> str:
    if call.method == "initialize":
        runner.initialize_kv_cache(int(call.args["num_blocks"]))
        return "ok"
    if call.method == "sleep":
        return runner.sleep(int(call.args["level"]))
    if call.method == "wake_up":
        return runner.wake_up()
    if call.method == "start_profile":
        return runner.start_profile(str(call.args["dir"]))
    if call.method == "stop_profile":
        return runner.stop_profile()
    if call.method == "shutdown":
        _leave_tensor_parallel_group()
        return "bye"
    raise ValueError(f"unknown executor call {call.method!r}")


def _leave_tensor_parallel_group() -> None:
    """Destroy the process group before exiting: an NCCL group left alive warns at exit and may hold the
    process until the scheduler's kill timeout. Every rank receives the shutdown call, so all leave."""
    if "engine.distributed" in sys.modules:             # imported only when tp > 1
        from engine.distributed import destroy_tensor_parallel

        destroy_tensor_parallel()


if __name__ == "__main__":
    sys.exit(main())
