"""frontend/metrics.py on its own: per-app registries, series per model and engine, phase latencies, unknown
finish reasons, model lifecycle, busy log."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client.parser import text_string_to_metric_families

from engine.client.model_pool import ModelPool
from engine.config import EngineConfig
from engine.messages import SchedulerStats
from frontend.metrics import ServerMetrics, log_stats_periodically


class StatsOnly:
    def __init__(self, name: str = "m"):
        self.config = EngineConfig(served_model_name=name)
        self.num_blocks = 100
        self.stats = SchedulerStats()
        self.is_dead = False


def metrics_of(*engines) -> ServerMetrics:
    """The metrics of a pool of these running engines."""
    pool = ModelPool.of_client(engines[0])
    for engine in engines[1:]:
        pool.models.update(ModelPool.of_client(engine).models)
    return ServerMetrics(pool)


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_each_app_has_its_own_registry():
    a, b = metrics_of(StatsOnly("a")), metrics_of(StatsOnly("b"))
    a.model("a").engine(0).generation_tokens += 7
    assert samples(a)["ringserve:generation_tokens_total", (("engine", "0"), ("model_name", "a"))] == 7
    assert samples(b)["ringserve:generation_tokens_total", (("engine", "0"), ("model_name", "b"))] == 0


def test_each_model_has_its_series_and_its_lifecycle():
    """Two models: the running one's engine stats and counters under its name, the other's at 0; each one's
    state (one-hot), loading progress and loads."""
    running = StatsOnly("a")
    metrics = metrics_of(running, StatsOnly("b"))
    b = metrics.pool.models["b"]
    b.client, b.state = None, "unloaded"
    running.stats = SchedulerStats(num_running=2)
    metrics.model("a").engine(0).prompt_tokens += 5
    got = samples(metrics)
    assert got["ringserve:num_requests_running", (("engine", "0"), ("model_name", "a"))] == 2
    assert ("ringserve:num_requests_running", (("engine", "0"), ("model_name", "b"))) not in got
    assert got["ringserve:prompt_tokens_total", (("engine", "0"), ("model_name", "a"))] == 5
    assert got["ringserve:prompt_tokens_total", (("engine", "0"), ("model_name", "b"))] == 0
    assert got["ringserve:model_state", (("model_name", "a"), ("state", "loaded"))] == 1
    assert got["ringserve:model_state", (("model_name", "a"), ("state", "unloaded"))] == 0
    assert got["ringserve:model_state", (("model_name", "b"), ("state", "unloaded"))] == 1
    assert got["ringserve:model_load_progress", (("model_name", "a"),)] == 1.0
    assert got["ringserve:model_load_progress", (("model_name", "b"),)] == 0.0


def test_engine_stats_are_read_at_scrape_time():
    engine = StatsOnly()
    metrics = metrics_of(engine)
    engine.stats = SchedulerStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, prefix_cache_queries=100,
                                  prefix_cache_hits=40, num_preemptions=1)
    got = samples(metrics)
    label = (("engine", "0"), ("model_name", "m"))
    assert got["ringserve:num_requests_running", label] == 3
    assert got["ringserve:num_requests_waiting", label] == 2
    assert got["ringserve:kv_cache_usage_perc", label] == 0.25
    assert got["ringserve:prefix_cache_hits_total", label] == 40
    assert got["ringserve:num_preemptions_total", label] == 1


class TwoEngines:
    """What DPEngineClient shows the metrics: per-rank stats, the config and the per-engine KV capacity."""

    def __init__(self):
        from engine.config import EngineConfig

        self.config = EngineConfig(served_model_name="m", block_size=32, gpu_memory_utilization=0.5,
                                   data_parallel_size=2)
        self.num_blocks = 1000
        self.engine_stats = [SchedulerStats(num_running=1, num_waiting=4, prefix_cache_hits=10),
                             SchedulerStats(num_running=2, num_waiting=0, prefix_cache_hits=30)]
        self.stats = SchedulerStats()
        self.is_dead = False


def test_each_data_parallel_engine_has_its_series_and_its_cache_config_info():
    metrics = metrics_of(TwoEngines())
    metrics.model("m").engine(1).record_finished("stop", arrival=0.0, scheduled=None, first_token=None, last_token=1.0)
    got = samples(metrics)
    # the frontend's own series carry the engine too: a router sees which rank served what
    assert got["ringserve:request_success_total", (("engine", "1"), ("finished_reason", "stop"), ("model_name", "m"))] == 1
    assert got["ringserve:request_success_total", (("engine", "0"), ("finished_reason", "stop"), ("model_name", "m"))] == 0
    assert got["ringserve:prompt_tokens_total", (("engine", "1"), ("model_name", "m"))] == 0
    for rank, (running, waiting, hits) in enumerate([(1, 4, 10), (2, 0, 30)]):
        label = (("engine", str(rank)), ("model_name", "m"))
        assert got["ringserve:num_requests_running", label] == running
        assert got["ringserve:num_requests_waiting", label] == waiting
        assert got["ringserve:prefix_cache_hits_total", label] == hits
        info = (("block_size", "32"), ("enable_prefix_caching", "True"), ("engine", str(rank)),
                ("gpu_memory_utilization", "0.5"), ("model_name", "m"), ("num_gpu_blocks", "1000"))
        assert got["ringserve:cache_config_info", info] == 1


def test_record_finished_observes_each_phase():
    metrics = metrics_of(StatsOnly())
    engine = metrics.model("m").engine(0)
    engine.record_finished("length", arrival=10.0, scheduled=10.5, first_token=11.0, last_token=13.0)
    engine.record_finished("some_new_reason", arrival=0.0, scheduled=None, first_token=None, last_token=1.0)
    got = samples(metrics)
    label = (("engine", "0"), ("model_name", "m"))
    assert got["ringserve:request_queue_time_seconds_sum", label] == 0.5
    assert got["ringserve:request_prefill_time_seconds_sum", label] == 0.5
    assert got["ringserve:request_decode_time_seconds_sum", label] == 2.0
    assert got["ringserve:e2e_request_latency_seconds_sum", label] == 3.0 + 1.0
    reason = (("engine", "0"), ("finished_reason", "some_new_reason"), ("model_name", "m"))
    assert got["ringserve:request_success_total", reason] == 1


def test_busy_log_line_only_while_busy_and_never_for_a_dead_engine(caplog):
    """Nothing while idle; running/KV/throughput while busy; nothing once the engine is dead (its last stats
    describe requests that failed: the line stops rather than repeat them)."""
    engine = StatsOnly()
    metrics = metrics_of(engine)
    counts = metrics.model("m").engine(0)

    async def run():
        task = asyncio.create_task(log_stats_periodically(metrics, 0.05))
        await asyncio.sleep(0.12)                       # idle: nothing to say
        idle_lines = len(caplog.records)
        engine.stats = SchedulerStats(num_running=2, kv_cache_usage=0.5)
        counts.generation_tokens += 100
        await asyncio.sleep(0.08)
        busy_lines = len(caplog.records)
        engine.is_dead = True
        counts.generation_tokens += 100
        await asyncio.sleep(0.2)
        task.cancel()
        return idle_lines, busy_lines

    with caplog.at_level(logging.INFO, logger="ringserve.metrics"):
        idle_lines, busy_lines = asyncio.run(run())
    assert idle_lines == 0 and busy_lines >= 1 and len(caplog.records) == busy_lines
    line = caplog.records[-1].getMessage()
    assert "Running: 2 reqs" in line and "KV cache usage: 50.0%" in line and "Generation throughput" in line
