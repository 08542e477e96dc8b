"""The engine inside the caller (`in_process=True`: debugging, unit tests, `bench engine-overhead`).

The scheduler process's loop (engine/core/main.py) without the process: an EngineCore over one
LocalExecutor, turned once each time the caller reads and finds nothing waiting. It offers the calls that
engine/client/scheduler_process.py offers over the rings (start, write, read, try_read, exit_status, stop,
close), so EngineClient has one code path for both; only the blocking face works here, since the steps run
in the reading thread.
"""

from __future__ import annotations

import collections
import time

from engine.config import EngineConfig
from engine.core.engine_core import COMPILE_POLL_S, EngineCore
from engine.messages import EngineReady
from shm.ring import RingTimeout


class InProcessEngine:
    supports_async = False          # the steps run in whichever thread reads: the blocking face only

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._core: EngineCore | None = None
        self._out: collections.deque = collections.deque()

    def start(self) -> EngineReady:
        from engine.executor.group import LocalExecutor     # loads torch and the model

        executor = LocalExecutor(self.config)
        self._core = EngineCore(self.config, executor)
        return EngineReady(num_blocks=executor.num_blocks, block_size=self.config.block_size,
                           max_model_len=self.config.max_model_len, pids=dict(executor.pids),
                           weight_bytes=dict(executor.weight_bytes))

    def write(self, msg, timeout: float | None = None) -> None:
        reply = self._core.handle(msg)          # handled at once, as the process drains its ring first
        if reply is not None:
            self._out.append(reply)

    def read(self, timeout: float | None):
        if not self._out:
            self._turn()
        if not self._out:
            raise RingTimeout("the engine has no output")
        return self._out.popleft()

    def try_read(self):
        return self._out.popleft() if self._out else None

    def _turn(self) -> None:
        """One pass of engine/core/main.py's loop after its ring is drained."""
        core = self._core
        if core.only_compiling:
            time.sleep(COMPILE_POLL_S)          # nothing to step until a grammar compile ends
        rejected = core.take_rejected()
        if rejected is not None:
            self._out.append(rejected)
        if core.has_work:
            outputs = core.step()
            if outputs is not None:
                self._out.append(outputs)

    def exit_status(self) -> str | None:
        return None                             # it lives and dies with the caller

    def stop(self, timeout: float) -> None:
        if self._core is not None:
            self._core.close()
            self._core.executor.shutdown()

    def close(self) -> None:
        self._core = None
