"""The scheduler process and the two rings to it: how EngineClient reaches a multi-process engine.

`start()` creates the request and output rings, spawns `python -m engine.core.main` with their specs and
waits for its EngineReady (or EngineDead), passing on its progress (EngineLoading) meanwhile; then `write()` sends one message, `read()` waits for the next one
and `try_read()` takes one if there is one, each decoding and encoding with msgspec (no pickle). A dead
scheduler surfaces as PeerDiedError from a ring call and as `exit_status()`. engine/core/inproc.py offers the
same calls over an engine in the caller's thread, so EngineClient has one code path for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.config import EngineConfig
from engine.messages import Codec, EngineDead, EngineLoading, EngineOut, EngineReady, RequestIn
from engine.outputs import EngineDeadError
from engine.process import describe_exit, spawn, stop
from shm.ring import RingTimeout, SpscRing
from shm.segment import sweep_stale
from shm.wait import PeerDiedError


class SchedulerProcess:
    supports_async = True           # a reader thread may wait on the output ring while the loop runs

    def __init__(self, config: EngineConfig, env: dict[str, str] | None = None,
                 on_loading: Callable[[EngineLoading], None] | None = None) -> None:
        self.config = config
        self._env = env
        self._on_loading = on_loading           # hears the startup's progress (EngineLoading) until EngineReady
        self._proc = None
        self._requests: SpscRing | None = None
        self._outputs: SpscRing | None = None
        self._codec_in = Codec(EngineOut)
        self._codec_out = Codec(RequestIn)

    def start(self) -> EngineReady:
        """Spawn the scheduler and wait for its handshake; EngineDeadError (everything released) if it fails."""
        sweep_stale()
        config = self.config
        self._requests = SpscRing.create(config.request_ring_bytes, spin_us=0)
        self._outputs = SpscRing.create(config.output_ring_bytes, spin_us=0)
        try:
            self._proc = spawn("engine.core.main", {
                "config": config.to_json().decode(),
                "request_ring": self._requests.spec.to_json().decode(),
                "output_ring": self._outputs.spec.to_json().decode(),
            }, env=self._env)
            self._requests.set_peer_check(self._check_scheduler)
            self._outputs.set_peer_check(self._check_scheduler)
            deadline = time.monotonic() + config.startup_timeout_s
            msg = self.read(timeout=config.startup_timeout_s)
            while isinstance(msg, EngineLoading):
                if self._on_loading is not None:
                    self._on_loading(msg)
                msg = self.read(timeout=max(deadline - time.monotonic(), 0.1))
        except PeerDiedError as e:
            self._abandon()
            raise EngineDeadError(f"the engine failed to start: {e}") from None
        except RingTimeout:
            self._abandon()
            raise EngineDeadError(f"the engine did not start within {config.startup_timeout_s:.0f} s") from None
        if isinstance(msg, EngineDead):
            self._abandon()
            raise EngineDeadError(f"the engine failed to start: {msg.message}")
        assert isinstance(msg, EngineReady), msg
        self._requests.unlink()         # both ends are attached: nothing is left in /dev/shm from here on
        self._outputs.unlink()
        return msg

    def write(self, msg, timeout: float | None = 30.0) -> None:
        self._requests.write(self._codec_out.encode(msg), timeout=timeout)

    def read(self, timeout: float | None):
        with self._outputs.read_view(timeout=timeout, spin_us=0) as view:
            return self._codec_in.decode(view)

    def try_read(self):
        data = self._outputs.try_read()
        return None if data is None else self._codec_in.decode(data)

    def exit_status(self) -> str | None:
        """How the scheduler ended ("the scheduler (pid N) was killed by signal SIGKILL"), None while it runs."""
        return None if self._proc is None else describe_exit(self._proc, "the scheduler")

    def stop(self, timeout: float) -> None:
        """Wait up to `timeout` for the scheduler to leave (after its shutdown call), then make it."""
        stop([self._proc], timeout=timeout)

    def close(self) -> None:
        self._requests.close()
        self._outputs.close()

    def _abandon(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        for ring in (self._requests, self._outputs):
            ring.unlink()
            ring.close()

    def _check_scheduler(self) -> None:
        how = self.exit_status()
        if how is not None:
            raise PeerDiedError(how)
