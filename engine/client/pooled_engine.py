"""One model of a ModelPool: its slot (PooledModel: config, state, running engine, use) and its face to the
frontend's handlers (PooledEngine: an AsyncEngine whose every request acquires the model, loading or waking
it first, runs on its engine, and releases it at its end, so that the pool never unloads a model with
requests in flight)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from engine.client.base import AsyncEngine
from engine.config import EngineConfig
from engine.messages import EngineLoading, SchedulerStats
from engine.outputs import EngineDeadError

if TYPE_CHECKING:
    import asyncio

    from engine.client.model_pool import ModelPool

UNLOADED, LOADING, LOADED, SLEEPING, UNLOADING = "unloaded", "loading", "loaded", "sleeping", "unloading"


class UnknownModelError(LookupError):
    """No model of that name: the message names it and lists those that exist."""

    def __init__(self, name: str, available: list[str]) -> None:
        listed = ", ".join(f"`{n}`" for n in available) or "none"
        super().__init__(f"The model `{name}` does not exist; this server serves {listed}.")
        self.name = name


class PooledModel:
    """One model's slot: its config, its engine while one runs, and what the pool knows about its use."""

    def __init__(self, name: str, config: EngineConfig, pool: ModelPool) -> None:
        self.name = name
        self.config = config
        self.state = UNLOADED
        self.client: AsyncEngine | None = None      # the running engine (loaded or sleeping)
        self.starting: AsyncEngine | None = None    # the engine being started (its loading progress)
        self.busy: asyncio.Task | None = None       # the transition under way: load, unload, sleep, wake
        self.in_flight = 0
        self.last_used = 0.0
        self.sleep_level = 0
        self.drained_for: object | None = None      # the waiter it is being emptied for: no new requests
        self.keep_alive_until: float | None = None  # a request's expiry (keep_alive); None: idle_unload_s
        self.loads = self.unloads = 0
        self.load_seconds: float | None = None      # the last load's duration
        self.protected_until = 0.0                  # not unloaded for another model before (just loaded)
        self.prefetching = False
        self.parking = False                        # being put to sleep at level 2 to make room
        self.parked = False                         # asleep at level 2 because room was made (not asked to)
        self.engine = PooledEngine(self, pool)

    @property
    def progress(self) -> float:
        """How far the load is: 0 unloaded, 1 loaded; between, the engine's startup stages."""
        if self.state != LOADING:
            return 0.0 if self.client is None else 1.0
        loading = getattr(self.starting, "loading", None) or EngineLoading(stage="processes")
        if loading.stage == "weights" and loading.total:
            return 0.1 + 0.8 * loading.done / loading.total
        return {"processes": 0.05, "kv_cache": 0.9, "ready": 1.0}.get(loading.stage, 0.05)


class PooledEngine:
    """A model's requests, through its pool; its state (stats, death) is its running engine's, if any."""

    def __init__(self, model: PooledModel, pool: ModelPool) -> None:
        self.model = model
        self.pool = pool

    @property
    def config(self) -> EngineConfig:
        return self.model.config

    @property
    def max_model_len(self) -> int:
        return self.model.config.max_model_len

    @property
    def _client(self):
        return self.model.client

    @property
    def num_blocks(self) -> int:
        return self._client.num_blocks if self._client is not None else 0

    @property
    def weight_bytes(self) -> dict[str, int]:
        return getattr(self._client, "weight_bytes", {}) or {}

    @property
    def is_dead(self) -> bool:
        return self._client is not None and self._client.is_dead

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._client.dead_error if self._client is not None else None

    @property
    def stats(self) -> SchedulerStats:
        return self._client.stats if self._client is not None else SchedulerStats()

    @property
    def engine_stats(self) -> list[SchedulerStats]:
        """One per data-parallel engine while the model runs; none while it does not."""
        if self._client is None:
            return []
        return getattr(self._client, "engine_stats", None) or [self._client.stats]

    @property
    def num_unfinished(self) -> int:
        return self._client.num_unfinished if self._client is not None else 0

    def start(self) -> PooledEngine:
        return self

    async def generate(self, request_id: str, prompt_token_ids, params, **options) -> AsyncIterator:
        client = await self.pool.acquire(self.model.name)
        try:
            async for delta in client.generate(request_id, prompt_token_ids, params, **options):
                yield delta
        finally:
            self.pool.release(self.model)

    async def encode(self, request_id: str, prompt_token_ids, pooling_params=None, **options) -> AsyncIterator:
        client = await self.pool.acquire(self.model.name)
        try:
            async for output in client.encode(request_id, prompt_token_ids, pooling_params, **options):
                yield output
        finally:
            self.pool.release(self.model)

    async def call(self, method: str, **args) -> str:
        client = await self.pool.acquire(self.model.name)
        try:
            return await client.call(method, **args)
        finally:
            self.pool.release(self.model)

    def fail_unfinished(self, error: EngineDeadError) -> None:
        if self._client is not None:
            self._client.fail_unfinished(error)

    async def shutdown(self) -> None:
        await self.pool.unload(self.model.name)
