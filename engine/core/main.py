"""The scheduler process (`python -m engine.core.main`).

It attaches the frontend's request and output rings, starts the executors (`ExecutorGroup`), completes the
startup handshake (EngineReady with the KV capacity), and loops: drain the request ring, step the
`EngineCore`, write the outputs. It loops until told to stop or a peer dies, in which case it tells the
frontend which process died and how (EngineDead) before it exits. It never imports torch.
"""

from __future__ import annotations

import gc
import os
import sys

from engine.config import EngineConfig
from engine.core.engine_core import COMPILE_POLL_S, EngineCore
from engine.errors import ExecutorError
from engine.executor.group import ExecutorGroup
from engine.messages import Codec, EngineDead, EngineLoading, EngineOut, EngineReady, RequestIn
from engine.process import child_args, error_text, parent_check
from shm.ring import RingSpec, SpscRing
from shm.wait import PeerDiedError


def main() -> int:
    args = child_args()
    config = EngineConfig.from_json(args["config"])
    requests = SpscRing.attach(RingSpec.from_json(args["request_ring"]), spin_us=0)
    outputs = SpscRing.attach(RingSpec.from_json(args["output_ring"]), spin_us=0)
    check_parent = parent_check(args["parent_pid"], "the frontend")
    requests.set_peer_check(check_parent)
    outputs.set_peer_check(check_parent)
    codec_out = Codec(EngineOut)
    executors = core = None
    try:
        def progress(stage: str, done: int, total: int) -> None:
            outputs.write(codec_out.encode(EngineLoading(stage=stage, done=done, total=total)))

        executors = ExecutorGroup(config, parent_check=check_parent, on_progress=progress)
        requests.set_peer_check(executors.check)
        outputs.set_peer_check(executors.check)
        core = EngineCore(config, executors)
        gc.collect()
        gc.freeze()        # the block pool's objects live forever: keep them out of every GC pass
        outputs.write(codec_out.encode(EngineReady(
            num_blocks=executors.num_blocks, block_size=config.block_size,
            max_model_len=config.max_model_len, pids={"scheduler": os.getpid(), **executors.pids},
            weight_bytes=executors.weight_bytes,
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
            executors.close(kill_now=True)
        return 1
    finally:
        if core is not None:
            core.close()            # the KV events publisher, if any: flush and release its sockets
        requests.close()
        outputs.close()


def _loop(core: EngineCore, requests: SpscRing, outputs: SpscRing, codec_out: Codec) -> None:
    codec_in = Codec(RequestIn)
    while True:
        if not core.has_work:
            requests.wait_readable(timeout=None)
        elif core.only_compiling:                   # nothing to step until a grammar compile ends
            requests.wait_readable(timeout=COMPILE_POLL_S)
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
