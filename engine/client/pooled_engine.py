"""PooledEngine: one model of a ModelPool as the frontend's handlers see it — an AsyncEngine whose every
request acquires the model (loading or waking it first), runs on its engine, and releases it at its end, so
that the pool never unloads a model with requests in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.messages import SchedulerStats
from engine.outputs import EngineDeadError

if TYPE_CHECKING:
    from engine.client.model_pool import ModelPool, PooledModel


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
