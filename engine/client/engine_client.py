"""EngineClient: the frontend's handle on the engine (DESIGN §2).

It starts the scheduler process (which starts the executors), owns the request ring (to the scheduler)
and the output ring (from it), and turns each step's EngineOutputs into per-request RequestDeltas.

Two faces over one state:
- asyncio (the server): `generate()` is an async iterator of deltas (`encode()` of one PoolingRequestOutput,
  for a pooling model); a reader thread waits on the output
  ring (sleeping on its semaphore, so it never competes with the event loop for the GIL) and hands each
  batch of messages to the loop with one call_soon_threadsafe.
- blocking (`LLM`): `add_request()` / `add_pooling_request()` and `poll()`, which reads the output ring in
  the caller's thread.

Users name requests with strings; on the rings they are int64 handles. The engine is reached through a
link with one set of calls: the scheduler process over its rings (engine/client/scheduler_process.py), or,
with `in_process=True`, the scheduler and one executor inside the caller (engine/core/inproc.py; no
processes, no rings; blocking face only).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator

import numpy as np

from engine.client.base import EngineClientBase
from engine.client.output_processor import RequestCollector, RequestState, deltas_from_outputs
from engine.client.pooling_requests import PoolingRequests
from engine.client.tokenizer import eos_token_ids
from engine.config import EngineConfig
from engine.client.scheduler_process import SchedulerProcess
from engine.messages import (
    HANDLE,
    AbortRequests,
    AddRequest,
    ControlCall,
    ControlReply,
    EngineDead,
    EngineLoading,
    EngineOutputs,
    SchedulerStats,
    pack,
)
from engine.errors import UnsupportedTaskError
from engine.outputs import EngineDeadError, RequestDelta
from engine.sampling_params import SamplingParams
from shm.ring import RingTimeout
from shm.wait import PeerDiedError

READER_SLICE_S = 0.25           # the reader thread re-checks for shutdown this often
logger = logging.getLogger("ringserve.engine")


class EngineClient(PoolingRequests, EngineClientBase):
    def __init__(self, config: EngineConfig, env: dict[str, str] | None = None) -> None:
        self.config = config.finalize()
        self._env = env                  # added to the scheduler's environment (a DP rank's devices)
        self.eos_token_ids = eos_token_ids(self.config)
        self.generation_defaults = self.config.sampling_defaults.values
        self.num_blocks = 0
        self.weight_bytes: dict[str, int] = {}         # what the executors' weights take, by type
        self.block_size = self.config.block_size
        self.max_model_len = self.config.max_model_len
        self.pids: dict[str, int] = {}
        self.loading = EngineLoading(stage="processes")   # startup progress, until EngineReady
        self._stats = SchedulerStats()
        self._handles = itertools.count(1)
        self._by_handle: dict[int, RequestState] = {}
        self._by_id: dict[str, int] = {}
        self._dead: EngineDeadError | None = None
        self._refusing: EngineDeadError | None = None   # set by fail_unfinished: no new requests either
        self._write_lock = threading.Lock()
        self._call_ids = itertools.count(1)
        self._calls: dict[int, object] = {}
        self._pending_sync: list[RequestDelta] = []
        self._link = None                # SchedulerProcess, or InProcessEngine (in_process=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        if self.config.in_process:
            from engine.core.inproc import InProcessEngine  # in-process mode only (debugging, unit tests)

            self._link = InProcessEngine(self.config)
        else:
            self._link = SchedulerProcess(self.config, self._env, on_loading=self._on_loading)
        try:
            ready = self._link.start()
        except EngineDeadError:
            self._closed = True
            raise
        self.num_blocks = ready.num_blocks
        self.weight_bytes = dict(ready.weight_bytes)
        self.pids = dict(ready.pids)
        self.loading = EngineLoading(stage="ready")
        atexit.register(self.shutdown_sync)

    def _on_loading(self, progress: EngineLoading) -> None:
        self.loading = progress

    def shutdown_sync(self, timeout: float = 10.0) -> None:
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        atexit.unregister(self.shutdown_sync)
        if self._link.exit_status() is None and self._dead is None:
            try:
                self._write(ControlCall(call_id=next(self._call_ids), method="shutdown"), timeout=2.0)
            except Exception:  # noqa: BLE001  the process is killed below if it does not leave
                pass
        self._link.stop(timeout)
        if self._reader is not None:
            self._reader.join(timeout=2 * READER_SLICE_S + 1)
        self._link.close()
        self._fail_all(self._dead or EngineDeadError("the engine was shut down"))

    # ------------------------------------------------------------------ state
    @property
    def is_dead(self) -> bool:
        if self._dead is None and self._link is not None and not self._closed:
            how = self._link.exit_status()
            if how is not None:
                self._set_dead(EngineDeadError(how))
        return self._dead is not None

    @property
    def dead_error(self) -> EngineDeadError | None:
        self.is_dead  # noqa: B018  refreshes from the process state
        return self._dead

    @property
    def stats(self) -> SchedulerStats:
        return self._stats

    @property
    def num_unfinished(self) -> int:
        return len(self._by_handle)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._refusing is not None:
            raise self._refusing
        if self._closed:
            raise EngineDeadError("the engine was shut down")
        if not self._started:
            raise RuntimeError("EngineClient.start() was not called")

    # ------------------------------------------------------------------ requests
    def check_task(self, pooling: bool) -> None:
        """UnsupportedTaskError unless the model serves this kind of request (the message says its kind)."""
        UnsupportedTaskError.check(self.config.model_name, self.config.runner, pooling)

    def _prompt_array(self, request_id: str, prompt_token_ids) -> np.ndarray:
        if request_id in self._by_id:
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt = np.asarray(prompt_token_ids, dtype=np.int64)
        if prompt.ndim != 1 or not len(prompt):
            raise ValueError("the prompt must be a non-empty list of token ids")
        vocab = self.config.vocab_size
        if prompt.min() < 0 or prompt.max() >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); found {int(prompt.max())}"
                             if prompt.max() >= vocab else "prompt token ids must not be negative")
        return prompt

    def _make_add(self, request_id: str, prompt_token_ids, params: SamplingParams, priority: int,
                  cache_salt: str | None, arrival_time: float | None) -> AddRequest:
        self.check_task(pooling=False)
        if params.n != 1:
            raise ValueError("the engine takes n == 1 requests; fan out with SamplingParams.child(i)")
        prompt = self._prompt_array(request_id, prompt_token_ids)
        if len(prompt) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; this model's max_model_len is {self.max_model_len}, "
                f"which leaves no room for output")
        blocks_needed = -(-(len(prompt) + 1) // self.block_size)
        if blocks_needed > self.num_blocks - 1:
            raise ValueError(
                f"the prompt needs {blocks_needed} KV blocks but the cache holds {self.num_blocks - 1}")
        if not params.is_resolved:
            params = params.resolved(self.generation_defaults)
        params.validate_against(vocab_size=self.config.vocab_size, max_logprobs=self.config.max_logprobs)
        return AddRequest(
            req=next(self._handles), prompt_token_ids=pack(prompt), params=params,
            eos_token_ids=self.eos_token_ids,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            priority=priority, cache_salt=cache_salt,
        )

    def _register(self, msg: AddRequest, request_id: str, collector: RequestCollector | None) -> None:
        self._by_handle[msg.req] = RequestState(request_id, collector, pooling=msg.pooling)
        self._by_id[request_id] = msg.req
        try:
            self._write(msg)
        except BaseException:
            self._forget(msg.req)
            raise

    def _forget(self, handle: int) -> None:
        state = self._by_handle.pop(handle, None)
        if state is not None:
            self._by_id.pop(state.request_id, None)

    def _write(self, msg, timeout: float | None = 30.0) -> None:
        with self._write_lock:
            try:
                self._link.write(msg, timeout=timeout)
            except PeerDiedError as e:
                self._set_dead(EngineDeadError(str(e)))
                raise self._dead from None

    # ------------------------------------------------------------------ the asyncio face
    async def generate(self, request_id: str, prompt_token_ids, params: SamplingParams, *,
                       priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                       data_parallel_rank: int | None = None) -> AsyncIterator[RequestDelta]:
        self._start_async_request(data_parallel_rank)
        msg = self._make_add(request_id, prompt_token_ids, params, priority, cache_salt, arrival_time)
        collector = RequestCollector()
        self._register(msg, request_id, collector)
        finished = False
        try:
            while True:
                delta = await collector.get()
                finished = delta.finished
                yield delta
                if finished:
                    return
        finally:
            if not finished:
                self._abort_handle(msg.req)

    def _start_async_request(self, data_parallel_rank: int | None) -> None:
        self._check_alive()
        if data_parallel_rank not in (None, 0):
            raise ValueError(f"data-parallel rank {data_parallel_rank} does not exist: one engine runs")
        if not self._link.supports_async:
            raise RuntimeError("the asyncio face needs the multi-process engine (in_process=False)")
        self._ensure_reader()

    async def abort(self, request_id: str) -> None:
        handle = self._by_id.get(request_id)
        if handle is not None:
            self._abort_handle(handle)

    def _abort_handle(self, handle: int) -> None:
        state = self._by_handle.get(handle)
        self._forget(handle)
        if state is None or self._dead is not None or self._closed:
            return
        try:
            self._write(AbortRequests(reqs=pack([handle], HANDLE)))
        except EngineDeadError:
            pass

    async def call(self, method: str, **args) -> str:
        self._check_alive()
        self._ensure_reader()
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._write(ControlCall(call_id=call_id, method=method, args=args))
        reply: ControlReply = await future
        if not reply.ok:
            raise ValueError(reply.result)
        return reply.result

    def _ensure_reader(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is not None:
            if loop is not self._loop:
                raise RuntimeError("an EngineClient serves one event loop")
            return
        self._loop = loop
        self._reader = threading.Thread(target=self._read_forever, name="ringserve-output-reader",
                                        daemon=True)
        self._reader.start()

    def _read_forever(self) -> None:
        loop = self._loop
        while not self._closed:
            try:
                first = self._link.read(timeout=READER_SLICE_S)
            except RingTimeout:
                if loop.is_closed():
                    return      # its owner finished without shutting us down: nobody to deliver to
                continue
            except PeerDiedError as e:
                if not self._closed:
                    _post(loop, self._set_dead, EngineDeadError(str(e)))
                return
            batch = [first]
            while (msg := self._link.try_read()) is not None:
                batch.append(msg)
            if not _post(loop, self._on_messages, batch) or isinstance(batch[-1], EngineDead):
                return      # the loop is gone (nobody left to deliver to) or the engine is dead

    def _on_messages(self, batch: list) -> None:
        for msg in batch:
            self._on_message(msg)

    # ------------------------------------------------------------------ the blocking face
    def add_request(self, request_id: str, prompt_token_ids, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None) -> None:
        self._check_alive()
        msg = self._make_add(request_id, prompt_token_ids, params, priority, cache_salt, None)
        self._register(msg, request_id, None)

    def abort_request(self, request_id: str) -> None:
        handle = self._by_id.get(request_id)
        if handle is not None:
            self._abort_handle(handle)

    def poll(self, timeout: float | None = None) -> list[RequestDelta]:
        """The deltas of the next engine step(s) for requests added through add_request()."""
        self._check_alive()
        try:
            self._on_message(self._link.read(timeout=timeout))
            while (msg := self._link.try_read()) is not None:
                self._on_message(msg)
        except RingTimeout:
            pass
        except PeerDiedError as e:
            self._set_dead(EngineDeadError(str(e)))
        if self._dead is not None:
            raise self._dead
        deltas, self._pending_sync = self._pending_sync, []
        return deltas

    def call_sync(self, method: str, **args) -> str:
        self._check_alive()
        call_id = next(self._call_ids)
        self._calls[call_id] = None
        self._write(ControlCall(call_id=call_id, method=method, args=args))
        while isinstance(self._calls.get(call_id), type(None)):
            self.poll(timeout=1.0)
        reply = self._calls.pop(call_id)
        if not reply.ok:
            raise ValueError(reply.result)
        return reply.result

    # ------------------------------------------------------------------ messages from the engine
    def _on_message(self, msg) -> None:
        if isinstance(msg, EngineOutputs):
            self._stats = msg.stats
            for state, delta in deltas_from_outputs(msg, self._by_handle, self._forget):
                if state.collector is not None:
                    state.collector.put(delta)
                else:
                    self._pending_sync.append(delta)
        elif isinstance(msg, ControlReply):
            waiter = self._calls.pop(msg.call_id, None)
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_result(msg)
            else:
                self._calls[msg.call_id] = msg
        elif isinstance(msg, EngineDead):
            self._set_dead(EngineDeadError(msg.message))

    def fail_unfinished(self, error: EngineDeadError) -> None:
        """End every unfinished request with `error` (aborted in the engine) and refuse new ones: the
        server is shutting down and will not wait for them any longer."""
        self._refusing = error
        handles = list(self._by_handle)
        if handles and self._dead is None and not self._closed:
            try:
                self._write(AbortRequests(reqs=pack(handles, HANDLE)))
            except EngineDeadError:
                pass
        self._fail_all(error)

    def _set_dead(self, error: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = error
            if not self._closed:
                rank = self.config.data_parallel_rank
                where = f"data-parallel engine {rank}: " if self.config.data_parallel_size > 1 else ""
                logger.error("the engine died: %s%s; its requests failed, /health answers 503 and new requests "
                             "are refused", where, error)
        self._fail_all(self._dead)

    def _fail_all(self, error: EngineDeadError) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and _running_loop() is not loop:
            if _post(loop, self._fail_all, error):      # asyncio objects belong to their loop
                return
        if loop is None or not loop.is_closed():         # on a closed loop nobody can await them any more
            for state in self._by_handle.values():
                if state.collector is not None:
                    state.collector.fail(error)
            for waiter in self._calls.values():
                if isinstance(waiter, asyncio.Future) and not waiter.done():
                    waiter.set_exception(error)
        self._by_handle.clear()
        self._by_id.clear()
        self._calls.clear()


def _post(loop: asyncio.AbstractEventLoop, callback, *args) -> bool:
    """Schedule callback on loop from another thread; False if the loop has been closed meanwhile."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:        # 'Event loop is closed': its owner finished without shutting us down
        return False
    return True


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
