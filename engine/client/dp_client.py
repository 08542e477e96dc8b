"""DPEngineClient: N data-parallel engine cores behind one frontend (`--data-parallel-size N`, vLLM's `-dp`).

Each rank is a whole engine: its own scheduler process, executors, rings and devices (a rank's scheduler
gets CUDA_VISIBLE_DEVICES narrowed to its `tensor_parallel_size` GPUs, so dp x tp GPUs in all). This class
wraps one `EngineClient` per rank with the same asyncio and blocking faces, so the server and its
handlers do not know how many engines run. Each request goes to one rank, picked by `Router` (load and
prefix) or pinned by the caller (`data_parallel_rank`, the X-data-parallel-rank header).

Failure: the death of one engine fails that engine's requests with an error naming its rank; the other
engines finish what they run, but `is_dead` turns True (so /health says 503 and new requests are refused),
as a server with a dead engine cannot keep its promises. No coordinator process is needed for dense
models: every EngineOutputs already carries its engine's scheduler stats.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator

import msgspec

from engine.client.base import EngineClientBase
from engine.client.engine_client import EngineClient
from engine.client.router import Router, load_score
from engine.config import EngineConfig
from engine.messages import SchedulerStats
from engine.outputs import EngineDeadError, PoolingRequestOutput, RequestDelta
from engine.sampling_params import PoolingParams, SamplingParams


def device_env(config: EngineConfig, rank: int) -> dict[str, str] | None:
    """CUDA_VISIBLE_DEVICES for data-parallel rank `rank`: its slice of tp devices of those visible."""
    if config.resolved_device != "cuda" or config.data_parallel_size == 1:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import torch  # already loaded: finalize() resolved the device with it

        devices = [str(i) for i in range(torch.cuda.device_count())]
    tp = config.tensor_parallel_size
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices[rank * tp:(rank + 1) * tp])}


class DPEngineClient(EngineClientBase):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config.finalize()
        n = self.config.data_parallel_size
        self.clients = [
            EngineClient(msgspec.structs.replace(self.config, data_parallel_rank=rank),
                         env=device_env(self.config, rank))
            for rank in range(n)
        ]
        first = self.clients[0]
        self.eos_token_ids = first.eos_token_ids
        self.generation_defaults = first.generation_defaults
        self.block_size = first.block_size
        self.max_model_len = first.max_model_len
        self.router: Router | None = None
        self._where: dict[str, int] = {}          # request id -> rank, while it runs

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        """Start every rank at once (each blocks on its own handshake); if one fails, stop them all."""
        errors: list[BaseException | None] = [None] * len(self.clients)

        def start(rank: int) -> None:
            try:
                self.clients[rank].start()
            except BaseException as e:  # noqa: BLE001  re-raised below, in the caller
                errors[rank] = e

        threads = [threading.Thread(target=start, args=(rank,), name=f"engine-start-dp{rank}", daemon=True)
                   for rank in range(len(self.clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
        if failed:
            self.shutdown_sync()
            rank, error = failed[0]
            raise EngineDeadError(f"data-parallel engine {rank}: {error}") from error
        capacity = sum(c.num_blocks for c in self.clients)
        self.router = Router(len(self.clients), self.block_size, self.config.data_parallel_routing,
                             capacity_blocks=capacity)

    def shutdown_sync(self, timeout: float = 10.0) -> None:
        for client in self.clients:
            client.shutdown_sync(timeout)

    def fail_unfinished(self, error: EngineDeadError) -> None:
        """End every engine's unfinished requests with `error` and refuse new ones (shutting down)."""
        for client in self.clients:
            client.fail_unfinished(error)

    # ------------------------------------------------------------------ state
    @property
    def num_blocks(self) -> int:
        """KV blocks of one engine (they are alike); what a single request can use."""
        return min(c.num_blocks for c in self.clients)

    @property
    def weight_bytes(self) -> dict[str, int]:
        """One engine's weights by type (every engine holds the same)."""
        return self.clients[0].weight_bytes

    @property
    def pids(self) -> dict[str, int]:
        return {f"dp{rank}.{name}": pid for rank, c in enumerate(self.clients) for name, pid in c.pids.items()}

    @property
    def is_dead(self) -> bool:
        return any(c.is_dead for c in self.clients)

    @property
    def dead_error(self) -> EngineDeadError | None:
        for rank, client in enumerate(self.clients):
            error = client.dead_error
            if error is not None:
                return EngineDeadError(f"data-parallel engine {rank}: {error}")
        return None

    @property
    def engine_stats(self) -> list[SchedulerStats]:
        """Each rank's latest scheduler stats, by rank (the metrics' `engine` label)."""
        return [c.stats for c in self.clients]

    @property
    def stats(self) -> SchedulerStats:
        """All ranks together: counts summed, KV usage averaged."""
        each = self.engine_stats
        return SchedulerStats(
            num_running=sum(s.num_running for s in each), num_waiting=sum(s.num_waiting for s in each),
            kv_cache_usage=sum(s.kv_cache_usage for s in each) / len(each),
            prefix_cache_queries=sum(s.prefix_cache_queries for s in each),
            prefix_cache_hits=sum(s.prefix_cache_hits for s in each),
            num_preemptions=sum(s.num_preemptions for s in each),
            num_free_blocks=sum(s.num_free_blocks for s in each), step=max(s.step for s in each),
            spec_num_drafts=sum(s.spec_num_drafts for s in each),
            spec_num_draft_tokens=sum(s.spec_num_draft_tokens for s in each),
            spec_num_accepted_tokens=sum(s.spec_num_accepted_tokens for s in each),
            spec_accepted_per_pos=[sum(column) for column in zip(*(s.spec_accepted_per_pos for s in each))],
        )

    @property
    def num_unfinished(self) -> int:
        return sum(c.num_unfinished for c in self.clients)

    def load_scores(self) -> list[int]:
        """Each rank's `waiting * 4 + running` from the freshest counts: the requests this frontend has
        in flight there, of which the scheduler's last step reported `num_running` running."""
        scores = []
        for client in self.clients:
            unfinished = client.num_unfinished
            running = min(client.stats.num_running, unfinished)
            scores.append(load_score(unfinished - running, running))
        return scores

    def _check_alive(self) -> None:
        if not self._started or self.router is None:
            raise RuntimeError("DPEngineClient.start() was not called")
        error = self.dead_error
        if error is not None:
            raise error

    def route(self, request_id: str, prompt_token_ids, cache_salt: str | None,
              data_parallel_rank: int | None) -> int:
        """Pick (or check the pinned) rank for a request and remember where it went."""
        if request_id in self._where:
            raise ValueError(f"request id {request_id!r} is already in use")
        router = self.router
        if data_parallel_rank is None:
            rank = router.choose(prompt_token_ids, cache_salt, self.load_scores())
        else:
            rank = router.pinned(data_parallel_rank, prompt_token_ids, cache_salt)
        self._where[request_id] = rank
        return rank

    # ------------------------------------------------------------------ the asyncio face
    async def generate(self, request_id: str, prompt_token_ids, params: SamplingParams, *,
                       priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                       data_parallel_rank: int | None = None) -> AsyncIterator[RequestDelta]:
        self._check_alive()
        rank = self.route(request_id, prompt_token_ids, cache_salt, data_parallel_rank)
        stream = self.clients[rank].generate(request_id, prompt_token_ids, params, priority=priority,
                                             cache_salt=cache_salt, arrival_time=arrival_time)
        async for delta in self._relay(rank, request_id, stream):
            yield delta

    async def encode(self, request_id: str, prompt_token_ids, pooling_params: PoolingParams | None = None, *,
                     priority: int = 0, arrival_time: float | None = None,
                     data_parallel_rank: int | None = None) -> AsyncIterator[PoolingRequestOutput]:
        self._check_alive()
        self.clients[0].check_task(pooling=True)
        rank = self.route(request_id, prompt_token_ids, None, data_parallel_rank)
        stream = self.clients[rank].encode(request_id, prompt_token_ids, pooling_params, priority=priority,
                                           arrival_time=arrival_time)
        async for output in self._relay(rank, request_id, stream):
            yield output

    async def _relay(self, rank: int, request_id: str, stream: AsyncIterator) -> AsyncIterator:
        """A rank's stream for one request: its death named with the rank, the request forgotten at the end."""
        try:
            async for item in stream:
                if isinstance(item, RequestDelta):
                    item.engine = rank
                yield item
        except EngineDeadError as e:
            raise EngineDeadError(f"data-parallel engine {rank}: {e}") from None
        finally:
            self._where.pop(request_id, None)
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        rank = self._where.get(request_id)
        if rank is not None:
            await self.clients[rank].abort(request_id)

    async def call(self, method: str, **args) -> str:
        """A control call on every rank; the replies joined, each with its rank."""
        self._check_alive()
        replies = await asyncio.gather(*(c.call(method, **args) for c in self.clients))
        return "; ".join(f"dp{rank}: {reply}" for rank, reply in enumerate(replies))

    # ------------------------------------------------------------------ the blocking face
    def add_request(self, request_id: str, prompt_token_ids, params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    data_parallel_rank: int | None = None) -> None:
        self._check_alive()
        rank = self.route(request_id, prompt_token_ids, cache_salt, data_parallel_rank)
        try:
            self.clients[rank].add_request(request_id, prompt_token_ids, params, priority=priority,
                                           cache_salt=cache_salt)
        except BaseException:
            self._where.pop(request_id, None)
            raise

    def add_pooling_request(self, request_id: str, prompt_token_ids, pooling_params: PoolingParams | None = None,
                            *, priority: int = 0, data_parallel_rank: int | None = None) -> None:
        self._check_alive()
        self.clients[0].check_task(pooling=True)
        rank = self.route(request_id, prompt_token_ids, None, data_parallel_rank)
        try:
            self.clients[rank].add_pooling_request(request_id, prompt_token_ids, pooling_params, priority=priority)
        except BaseException:
            self._where.pop(request_id, None)
            raise

    def abort_request(self, request_id: str) -> None:
        rank = self._where.pop(request_id, None)
        if rank is not None:
            self.clients[rank].abort_request(request_id)

    def poll(self, timeout: float | None = None) -> list[RequestDelta]:
        """The deltas of the ranks' next steps. Ranks with work are polled in turn in short slices (one
        thread cannot sleep on several rings at once), so a poll returns within a slice of any news."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            busy = [(rank, c) for rank, c in enumerate(self.clients) if c.num_unfinished]
            deltas: list[RequestDelta] = []
            for rank, client in busy:
                try:
                    deltas += client.poll(timeout=0.001 if len(busy) > 1 else 0.01)
                except EngineDeadError as e:
                    raise EngineDeadError(f"data-parallel engine {rank}: {e}") from None
            if deltas or not busy or (deadline is not None and time.monotonic() >= deadline):
                for delta in deltas:
                    if delta.finished:
                        self._where.pop(delta.request_id, None)
                return deltas


def make_engine_client(config: EngineConfig) -> EngineClient | DPEngineClient:
    """The client the config asks for: one engine, or data_parallel_size of them behind a router."""
    config = config.finalize()
    return DPEngineClient(config) if config.data_parallel_size > 1 else EngineClient(config)
