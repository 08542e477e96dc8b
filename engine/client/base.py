"""What an engine client is to the frontend, and the start/stop code every client shares.

`AsyncEngine` is the face the HTTP server calls (its handlers, metrics, startup and shutdown): one engine
(`EngineClient`), several behind a router (`DPEngineClient`), or a test's fake all satisfy it, and the
frontend types its engine with it. `EngineClientBase` holds what a client's lifecycle repeats: start once,
the context manager, and the asyncio shutdown that runs the blocking one off the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Protocol, runtime_checkable

from engine.config import EngineConfig
from engine.messages import SchedulerStats
from engine.outputs import EngineDeadError, PoolingRequestOutput, RequestDelta
from engine.sampling_params import PoolingParams, SamplingParams


@runtime_checkable
class AsyncEngine(Protocol):
    """What the frontend calls on an engine client."""

    config: EngineConfig
    max_model_len: int
    num_blocks: int           # KV blocks of one engine (the startup line reports them)

    @property
    def is_dead(self) -> bool: ...

    @property
    def dead_error(self) -> EngineDeadError | None: ...

    @property
    def stats(self) -> SchedulerStats: ...

    @property
    def num_unfinished(self) -> int: ...

    def start(self) -> AsyncEngine: ...

    def generate(self, request_id: str, prompt_token_ids, params: SamplingParams, *, priority: int = 0,
                 cache_salt: str | None = None, arrival_time: float | None = None,
                 data_parallel_rank: int | None = None) -> AsyncIterator[RequestDelta]:
        """The request's deltas until it finishes; closing the iterator early aborts the request."""
        ...

    def encode(self, request_id: str, prompt_token_ids, pooling_params: PoolingParams | None = None, *,
               priority: int = 0, arrival_time: float | None = None,
               data_parallel_rank: int | None = None) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling model's vector for one prompt, as one output; closing the iterator early aborts the request."""
        ...

    async def call(self, method: str, **args) -> str:
        """A control call on the engine (start_profile, stop_profile, ...); its reply."""
        ...

    def fail_unfinished(self, error: EngineDeadError) -> None:
        """End every unfinished request with `error` and refuse new ones (the server is shutting down)."""
        ...

    async def shutdown(self) -> None: ...


class EngineClientBase:
    """Start once (`_start` does the work), stop with `shutdown_sync`, from a `with` block or asyncio."""

    _started = False

    def start(self):
        if self._started:
            return self
        self._started = True
        self._start()
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def shutdown_sync(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown_sync()

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown_sync)


async def in_daemon_thread(fn: Callable[[], object], name: str) -> None:
    """fn() in a daemon thread (a hung engine start cannot keep the process alive), awaited."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not future.done():
            future.set_result(None) if error is None else future.set_exception(error)

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  handed to the event loop
            error = e
        else:
            error = None
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:        # the loop closed before the thread finished
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    await future
