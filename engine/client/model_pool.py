"""ModelPool: several models behind one frontend (DESIGN §2, "Several models").

A model is an engine (a scheduler, its executors and their rings, started by an engine client); the pool
keeps one slot per model name, starts an engine when a request needs it, routes requests to it and stops it
again — the same start and stop that already leave nothing behind for one engine.

- `acquire(name)` returns the model's running client and counts one request in flight until `release`. An
  unloaded model is loaded first; a sleeping one is woken. With `max_loaded` engines up, the least recently
  used one without requests in flight is unloaded to make room; when every loaded model has requests in
  flight, the least recently used one is drained (its new requests wait) and unloaded once they finish.
  Waiters for room queue first come, first served; one that has waited `wait_s` gets EngineBusyError (a 503
  with Retry-After), so nothing waits without bound.
- `idle_unload_s` unloads a model nobody has used for that long; a request may set its own expiry
  (`keep_alive`, Ollama's), which overrides it for that model.
- `sleep(name, level)` frees the KV cache (level 1) or the weights too (level 2) while the processes stay;
  `wake_up(name)` undoes it, and so does a request.

Everything here runs on the event loop; engine starts and stops run in threads, so the loop keeps serving
the other models meanwhile. `PooledEngine` is one model as the handlers see it: an AsyncEngine whose
requests go through acquire and release.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from engine.client.base import AsyncEngine, in_daemon_thread
from engine.client.dp_client import make_engine_client
from engine.config import EngineConfig
from engine.errors import EngineBusyError
from engine.client.pooled_engine import (  # noqa: F401  (the states are the pool's vocabulary too)
    LOADED,
    LOADING,
    SLEEPING,
    UNLOADED,
    UNLOADING,
    PooledModel,
    UnknownModelError,
)
from engine.outputs import EngineDeadError

logger = logging.getLogger("ringserve.models")

SHUTDOWN_WAIT_S = 30.0            # how long shutdown waits for a load in progress before leaving it
LOAD_GRACE_S = 5.0                # a just-loaded model is kept this long for the request that loaded it


class ModelPool:
    def __init__(self, configs: dict[str, EngineConfig], *, max_loaded: int | None = None,
                 idle_unload_s: float | None = None, wait_s: float = 60.0, on_demand: bool = False,
                 max_parked: int = 0,
                 make_client: Callable[[EngineConfig], AsyncEngine] = make_engine_client) -> None:
        if not configs:
            raise ValueError("a model pool needs at least one model")
        if max_loaded is not None and max_loaded < 1:
            raise ValueError(f"max_loaded must be at least 1, got {max_loaded}")
        self.models = {name: PooledModel(name, config, self) for name, config in configs.items()}
        self.max_loaded = max_loaded or len(configs)
        self.idle_unload_s = idle_unload_s
        self.wait_s = wait_s
        # models come and go (--models-dir): a request for a model whose engine died starts it again, and a
        # request's keep_alive (Ollama's) is acted on; else one model stays up and its death stays visible
        self.on_demand = on_demand
        self.max_parked = max_parked               # models made room for are parked (asleep at level 2), this many
        self._make_client = make_client
        self._queue: deque[_Waiter] = deque()       # requests waiting for room, first come first served
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task | None = None
        self._closing: EngineDeadError | None = None
        self.on_unload: list[Callable[[str], None]] = []   # told each model's name as its engine stops

    @classmethod
    def of_client(cls, client: AsyncEngine, **options) -> ModelPool:
        """A pool of one model whose engine is already running (create_app over an engine client)."""
        pool = cls({client.config.model_name: client.config}, **options)
        model = pool.models[client.config.model_name]
        model.client, model.state, model.last_used = client, LOADED, time.monotonic()
        return pool

    # ------------------------------------------------------------------ the table
    @property
    def names(self) -> list[str]:
        return list(self.models)

    def model(self, name: str) -> PooledModel:
        model = self.models.get(name)
        if model is None:
            raise UnknownModelError(name, self.names)
        return model

    def running(self) -> list[PooledModel]:
        """The models with an engine up (loaded or asleep)."""
        return [m for m in self.models.values() if m.client is not None]

    @property
    def num_unfinished(self) -> int:
        return sum(m.client.num_unfinished for m in self.running())

    # ------------------------------------------------------------------ requests
    async def acquire(self, name: str) -> AsyncEngine:
        """The model's running engine, with one more request counted in flight (see `release`)."""
        model = self.model(name)
        deadline = time.monotonic() + self.wait_s
        waiter: _Waiter | None = None
        try:
            while True:
                if self._closing is not None:
                    raise self._closing
                if model.busy is not None:             # its load, wake, sleep or unload: wait for it
                    await asyncio.shield(model.busy)
                    continue
                if self.on_demand and model.state == LOADED and model.in_flight == 0 and model.client.is_dead:
                    self._begin(model, self._unload(model, f"its engine died: {model.client.dead_error}"))
                    continue
                if model.drained_for is None and model.state == LOADED:
                    model.in_flight += 1
                    model.last_used = time.monotonic()
                    model.protected_until = 0.0
                    return model.client
                if model.drained_for is None and model.state == SLEEPING and model.sleep_level < 2:
                    self._begin(model, self._wake(model))          # its weights are in: no room needed
                    continue
                if model.state == UNLOADED or (model.state == SLEEPING and model.drained_for is None):
                    if waiter is None:
                        waiter = _Waiter(name)
                        self._queue.append(waiter)
                    if self._queue[0] is waiter and self._make_room(waiter):
                        self._queue.popleft()
                        self._begin(model, self._wake(model) if model.state == SLEEPING else self._load(model))
                        continue
                await self._wait_change(deadline, name)
        finally:
            if waiter is not None:
                self._forget(waiter)

    def prefetch(self, name: str) -> None:
        """Start bringing the model up now (as a request would, making room) without waiting for it: a first
        request's other preparation (its tokenizer) then overlaps the engine's start. A model loaded this way
        is not unloaded for another within LOAD_GRACE_S, so the request that asked finds it up."""
        model = self.model(name)
        if model.state not in (LOADED, LOADING) and not model.prefetching and self._closing is None:
            model.prefetching = True
            asyncio.ensure_future(self._prefetch(model))

    async def _prefetch(self, model: PooledModel) -> None:
        try:
            await self.acquire(model.name)
        except Exception:  # noqa: BLE001  the request's own acquire meets the same failure and reports it
            return
        finally:
            model.prefetching = False
        self.release(model)

    def release(self, model: PooledModel) -> None:
        model.in_flight -= 1
        model.last_used = time.monotonic()
        if model.in_flight == 0:
            self._notify()

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """A request's keep_alive (Ollama's): unload the model `seconds` after now (0: as soon as it is
        idle; negative: never by idleness); None: back to the server's --idle-unload."""
        model = self.model(name)
        if seconds is None:
            model.keep_alive_until = None
        else:
            model.keep_alive_until = float("inf") if seconds < 0 else time.monotonic() + seconds
        self._ensure_reaper()

    def expires_at(self, model: PooledModel) -> float | None:
        """time.monotonic() at which the idle model will be unloaded; None: never by idleness."""
        if model.keep_alive_until is not None:
            return None if model.keep_alive_until == float("inf") else model.keep_alive_until
        return model.last_used + self.idle_unload_s if self.idle_unload_s else None

    def _make_room(self, waiter: _Waiter) -> bool:
        """True when one more model's weights may come in; else start freeing a slot (park or unload the least
        recently used idle model, or drain the least recently used busy one) and return False."""
        occupied = [m for m in self.models.values() if self._holds_slot(m)]
        if len(occupied) < self.max_loaded:
            return True
        now = time.monotonic()
        candidates = [m for m in occupied if m.busy is None and m.state in (LOADED, SLEEPING)
                      and m.protected_until <= now]
        idle = [m for m in candidates if m.in_flight == 0]
        if idle:
            victim = min(idle, key=lambda m: m.last_used)
            why = f"to make room for {waiter.name}"
            self._begin(victim, self._park(victim, why) if self.max_parked else self._unload(victim, why))
            return sum(1 for m in self.models.values() if self._holds_slot(m)) < self.max_loaded
        if candidates and not any(m.drained_for is not None for m in candidates):
            victim = min(candidates, key=lambda m: m.last_used)
            victim.drained_for = waiter
            logger.info("model %s: finishing its %d requests, then unloading it to make room for %s",
                        victim.name, victim.in_flight, waiter.name)
        return False

    @staticmethod
    def _holds_slot(m: PooledModel) -> bool:
        """Whether the model's weights take one of the --models-max slots: up, starting or waking, or stopping
        on a GPU. A CPU engine that is stopping or parking holds none: its memory is back in a moment, well
        before the next model's weights are in, so a swap overlaps the two. A model asleep at level 2 (parked)
        holds none: it keeps its processes, not its weights."""
        if m.state == UNLOADED and m.busy is None:
            return False
        if m.state == SLEEPING and m.sleep_level >= 2 and m.busy is None:
            return False
        stopping = m.state == UNLOADING or m.parking
        return not (stopping and m.config.resolved_device == "cpu")

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._queue:
            self._queue.remove(waiter)
        for model in self.models.values():
            if model.drained_for is waiter:
                model.drained_for = None
        self._notify()

    async def _wait_change(self, deadline: float, name: str) -> None:
        now = time.monotonic()
        remaining = deadline - now
        if remaining > 0:
            # a just-loaded model's protection lapses without any event: look again when it does
            lapses = [m.protected_until - now for m in self.models.values() if m.protected_until > now]
            try:
                await asyncio.wait_for(self._changed.wait(), min([remaining, *lapses]))
            except asyncio.TimeoutError:
                pass
            if time.monotonic() < deadline:
                return
        busy = ", ".join(f"{m.name} ({m.in_flight} in flight)" for m in self.running())
        raise EngineBusyError(f"the model {name} waited {self.wait_s:g} s for room: {self.max_loaded} model(s) may "
                              f"be loaded at once (--models-max) and each has requests in flight: {busy}",
                              retry_after=max(1.0, self.wait_s / 4))

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle routes
    async def load(self, name: str) -> PooledModel:
        """Load the model (or wake it) now, making room as a request would."""
        model = self.model(name)
        await self.acquire(name)
        self.release(model)
        return model

    async def unload(self, name: str) -> PooledModel:
        """Stop the model's engine once its requests in flight have finished (new ones wait meanwhile)."""
        model = self.model(name)
        await self._quiesce(model, lambda: self._unload(model, "asked to"))
        return model

    async def sleep(self, name: str, level: int = 1) -> PooledModel:
        """Free the model's KV cache (level 1) and weights (level 2) once its requests have finished."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        model = self.model(name)
        await self._quiesce(model, lambda: self._sleep(model, level),
                            skip=lambda: model.client is None or model.sleep_level >= level)
        return model

    async def wake_up(self, name: str) -> PooledModel:
        model = self.model(name)
        await self._quiesce(model, lambda: self._wake(model), skip=lambda: model.state != SLEEPING)
        return model

    async def _quiesce(self, model: PooledModel, transition, skip=None) -> None:
        """Run `transition` on the model once no request is in flight there, new ones held back meanwhile."""
        waiter = _Waiter(model.name)
        deadline = time.monotonic() + self.wait_s
        try:
            while True:
                if model.busy is not None:
                    await asyncio.shield(model.busy)
                    continue
                if model.client is None or (skip is not None and skip()):
                    return
                if model.in_flight == 0:
                    self._begin(model, transition())
                    await asyncio.shield(model.busy)
                    return
                if model.drained_for is None:
                    model.drained_for = waiter
                await self._wait_change(deadline, model.name)
        finally:
            self._forget(waiter)

    # ------------------------------------------------------------------ transitions (one at a time per model)
    def _begin(self, model: PooledModel, transition) -> None:
        task = asyncio.ensure_future(transition)
        model.busy = task

        def done(task: asyncio.Task) -> None:
            model.busy = None
            if not task.cancelled():
                task.exception()         # seen by whoever awaits it; never "never retrieved"
            self._notify()

        task.add_done_callback(done)
        self._notify()

    async def _load(self, model: PooledModel) -> None:
        model.state = LOADING
        started = time.monotonic()
        logger.info("model %s: loading (%d of %d loaded)", model.name, len(self.running()), self.max_loaded)
        client = model.starting = self._make_client(model.config)
        try:
            await in_daemon_thread(client.start, f"load-{model.name}")
        except asyncio.CancelledError:
            model.state = UNLOADED           # `starting` stays: shutdown() stops the engine being started
            raise
        except BaseException as e:
            model.state, model.starting = UNLOADED, None
            logger.error("model %s: failed to load: %s", model.name, e)
            await client.shutdown()                            # whatever the failed start left behind
            raise EngineDeadError(f"the model {model.name} failed to load: {e}") from None
        model.client, model.starting = client, None
        model.state, model.sleep_level, model.last_used = LOADED, 0, time.monotonic()
        model.protected_until = model.last_used + LOAD_GRACE_S
        model.loads += 1
        model.load_seconds = time.monotonic() - started
        logger.info("model %s: loaded in %.2f s", model.name, model.load_seconds)
        self._ensure_reaper()

    async def _unload(self, model: PooledModel, why: str) -> None:
        model.state = UNLOADING
        client, started = model.client, time.monotonic()
        try:
            await client.shutdown()
        finally:
            model.client, model.state, model.sleep_level, model.parked = None, UNLOADED, 0, False
            model.drained_for = model.keep_alive_until = None
            model.unloads += 1
            for listener in self.on_unload:
                listener(model.name)
        logger.info("model %s: unloaded (%s) in %.2f s", model.name, why, time.monotonic() - started)

    async def _park(self, model: PooledModel, why: str) -> None:
        """Make room by putting the model to sleep at level 2 (weights and KV cache dropped, processes kept),
        so that coming back costs a wake, not a start; beyond max_parked, the least recently used parked
        model is unloaded."""
        model.parking = True
        try:
            await self._sleep(model, 2)
            model.parked = True
        finally:
            model.parking = False
        logger.info("model %s: parked (%s)", model.name, why)
        wanted = {waiter.name for waiter in self._queue}         # a model a request waits for stays parked
        parked = sorted((m for m in self.models.values() if m.parked and m.state == SLEEPING
                         and (m is model or m.busy is None) and m.name not in wanted), key=lambda m: m.last_used)
        for extra in parked[:max(len(parked) - self.max_parked, 0)]:
            self._begin(extra, self._unload(extra, f"--models-parked {self.max_parked}"))

    async def _sleep(self, model: PooledModel, level: int) -> None:
        result = await model.client.call("sleep", level=level)
        model.state, model.sleep_level = SLEEPING, max(level, model.sleep_level)
        logger.info("model %s: %s", model.name, result)

    async def _wake(self, model: PooledModel) -> None:
        started = time.monotonic()
        await model.client.call("wake_up")
        model.state, model.sleep_level, model.parked = LOADED, 0, False
        logger.info("model %s: awake in %.3f s", model.name, time.monotonic() - started)

    # ------------------------------------------------------------------ idle unload and shutdown
    def start(self) -> None:
        """Start unloading idle models (on the running event loop), where the pool is asked to."""
        self._ensure_reaper()

    def _ensure_reaper(self) -> None:
        if self._reaper is None and self._closing is None and (
                self.idle_unload_s or any(m.keep_alive_until is not None for m in self.models.values())):
            self._reaper = asyncio.ensure_future(self._reap_idle())

    async def _reap_idle(self) -> None:
        interval = min(1.0, self.idle_unload_s / 4) if self.idle_unload_s else 1.0
        while True:
            await asyncio.sleep(max(interval, 0.05))
            now = time.monotonic()
            for model in self.models.values():
                if model.client is None or model.busy is not None or model.in_flight or model.drained_for:
                    continue
                expiry = self.expires_at(model)
                if expiry is not None and now >= expiry:
                    self._begin(model, self._unload(model, "idle"))

    def fail_unfinished(self, error: EngineDeadError) -> None:
        """Shutting down: every engine's unfinished requests end with `error`; new requests are refused."""
        self._closing = error
        for model in self.running():
            model.client.fail_unfinished(error)
        self._notify()

    async def shutdown(self) -> None:
        self._closing = self._closing or EngineDeadError("the server is shutting down")
        if self._reaper is not None:
            self._reaper.cancel()
        self._notify()
        # an engine still starting is stopped now, as its start may take minutes (or hang)
        starting = [m.starting for m in self.models.values() if m.starting is not None]
        pending = [m.busy for m in self.models.values() if m.busy is not None and m.starting is None]
        if pending:
            await asyncio.wait(pending, timeout=SHUTDOWN_WAIT_S)
        await asyncio.gather(*(m.client.shutdown() for m in self.running()), *(c.shutdown() for c in starting),
                             return_exceptions=True)
        for model in self.running():
            model.client, model.state = None, UNLOADED


class _Waiter:
    """A request waiting for room for its model."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name
