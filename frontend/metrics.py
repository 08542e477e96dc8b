"""Prometheus metrics under the `ringserve:` prefix, with vLLM's names and meanings, the busy-log line, and the
request-event log of a profile.

Each app has its own CollectorRegistry (two apps in one process do not share counters). The scheduler's
numbers (running, waiting, KV use, prefix-cache counters, preemptions) are read from the engine's latest
stats at scrape time, one series per engine with vLLM's labels (`model_name`, `engine`: the data-parallel
rank), as routers read them (the Gateway API Inference Extension's model-server protocol: queued,
running, KV-cache utilization, and `cache_config_info{block_size, num_gpu_blocks}`); token counters are plain ints bumped on the hot path and exported by the same
collector; latency histograms are observed per request and, for inter-token latency, per step.

Profiling on demand (RequestEventLog): POST /start_profile asks the engine (client.call("start_profile",
dir=...)) to start its torch profilers and opens a JSON-lines file of request-level events in the same
directory; POST /stop_profile stops both. Events are written per request (arrival and finish with its phase
timestamps), never per token. Times are time.monotonic(), the clock of every process on the machine; the
first line maps it to wall-clock time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import orjson

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.outputs import FINISH_REASONS

logger = logging.getLogger("ringserve.metrics")

PREFIX = "ringserve:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
         5.0, 10.0, 20.0, 40.0, 80.0)
_SLOW = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
         120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    """The metrics of one app; `render()` is the /metrics body."""

    def __init__(self, engine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(self))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]):
            metric = Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry)
            return metric.labels(model_name)

        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Time from arrival to the first generated token.", _FAST)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between consecutive engine steps of a request.", _FAST)
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Time from arrival to the last token.", _SLOW)
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Time from arrival to first scheduling.", _SLOW)
        self.request_prefill_time = histogram(
            "request_prefill_time_seconds", "Time from first scheduling to the first token.", _SLOW)
        self.request_decode_time = histogram(
            "request_decode_time_seconds", "Time from the first token to the last.", _SLOW)
        self._success = Counter(PREFIX + "request_success", "Finished requests, by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self.request_success = {reason: self._success.labels(model_name, reason) for reason in FINISH_REASONS}

    def record_finished(self, finish_reason: str, arrival: float, scheduled: float | None,
                        first_token: float | None, last_token: float | None) -> None:
        """One engine request ended: its outcome and its phase latencies (time.monotonic() values)."""
        counter = self.request_success.get(finish_reason)
        if counter is None:    # a reason this version does not know yet still gets counted
            counter = self.request_success[finish_reason] = self._success.labels(self.model_name, finish_reason)
        counter.inc()
        end = last_token if last_token is not None else time.monotonic()
        self.e2e_request_latency.observe(max(end - arrival, 0.0))
        if scheduled is not None:
            self.request_queue_time.observe(max(scheduled - arrival, 0.0))
            if first_token is not None:
                self.request_prefill_time.observe(max(first_token - scheduled, 0.0))
        if first_token is not None and last_token is not None:
            self.request_decode_time.observe(max(last_token - first_token, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Exports the scheduler's latest stats and the frontend's token counters at scrape time."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def collect(self):
        m = self._metrics
        engine = m.engine
        each = getattr(engine, "engine_stats", None) or [engine.stats]     # one per data-parallel rank
        for family, name, doc, field in (
            (GaugeMetricFamily, "num_requests_running", "Requests in the running batch.", "num_running"),
            (GaugeMetricFamily, "num_requests_waiting", "Requests waiting to be scheduled.", "num_waiting"),
            (GaugeMetricFamily, "kv_cache_usage_perc", "KV-cache usage as a fraction: 1 means 100 percent.",
             "kv_cache_usage"),
            (CounterMetricFamily, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             "prefix_cache_queries"),
            (CounterMetricFamily, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             "prefix_cache_hits"),
            (CounterMetricFamily, "num_preemptions", "Requests preempted for lack of KV blocks.",
             "num_preemptions"),
        ):
            metric = family(PREFIX + name, doc, labels=["model_name", "engine"])
            for rank, stats in enumerate(each):
                metric.add_metric([m.model_name, str(rank)], getattr(stats, field))
            yield metric
        config = getattr(engine, "config", None)
        if getattr(config, "speculative_config", None) is not None:
            yield from _spec_decode_metrics(m.model_name, each)
        if config is not None:
            # vLLM's info-style gauge (always 1): what KV-aware routers read to size a replica's cache.
            info = GaugeMetricFamily(PREFIX + "cache_config_info", "The KV cache's configuration.",
                                     labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching",
                                             "gpu_memory_utilization", "engine"])
            for rank in range(len(each)):
                info.add_metric([m.model_name, str(config.block_size), str(engine.num_blocks),
                                 str(config.enable_prefix_caching), str(config.gpu_memory_utilization), str(rank)], 1)
            yield info
        label = [m.model_name]
        for family, name, doc, value in (
            (CounterMetricFamily, "prompt_tokens", "Prompt tokens submitted to the engine.", m.prompt_tokens),
            (CounterMetricFamily, "generation_tokens", "Tokens generated.", m.generation_tokens),
        ):
            metric = family(PREFIX + name, doc, labels=["model_name"])
            metric.add_metric(label, value)
            yield metric


def _spec_decode_metrics(model_name: str, each: list):
    """vLLM's speculative-decoding counters: verify steps, draft tokens, accepted tokens, and accepted
    tokens per draft position (label `position`, 0 for the first draft)."""
    for name, doc, field in (
        ("spec_decode_num_drafts", "Request-steps that verified draft tokens.", "spec_num_drafts"),
        ("spec_decode_num_draft_tokens", "Draft tokens verified.", "spec_num_draft_tokens"),
        ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", "spec_num_accepted_tokens"),
    ):
        metric = CounterMetricFamily(PREFIX + name, doc, labels=["model_name", "engine"])
        for rank, stats in enumerate(each):
            metric.add_metric([model_name, str(rank)], getattr(stats, field))
        yield metric
    metric = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                 "Draft tokens accepted, by draft position.", labels=["model_name", "engine", "position"])
    for rank, stats in enumerate(each):
        for position, count in enumerate(stats.spec_accepted_per_pos):
            metric.add_metric([model_name, str(rank), str(position)], count)
    yield metric


async def log_stats_periodically(metrics: ServerMetrics, interval: float) -> None:
    """Every `interval` seconds while there is work: running/waiting, KV use and token throughput. Nothing
    once the engine is dead: its last figures would describe requests that have failed (the death itself is
    logged once, as an error, by the engine client)."""
    last_time = time.monotonic()
    last_prompt, last_generation = metrics.prompt_tokens, metrics.generation_tokens
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        stats = metrics.engine.stats
        prompt, generation = metrics.prompt_tokens, metrics.generation_tokens
        busy = stats.num_running or stats.num_waiting or prompt != last_prompt or generation != last_generation
        if metrics.engine.is_dead:
            busy = False
        if busy:
            elapsed = max(now - last_time, 1e-9)
            hit_rate = stats.prefix_cache_hits / stats.prefix_cache_queries if stats.prefix_cache_queries else 0.0
            logger.info(
                "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%, "
                "Prompt throughput: %.1f tokens/s, Generation throughput: %.1f tokens/s",
                stats.num_running, stats.num_waiting, 100 * stats.kv_cache_usage, 100 * hit_rate,
                (prompt - last_prompt) / elapsed, (generation - last_generation) / elapsed,
            )
        last_time, last_prompt, last_generation = now, prompt, generation


class RequestEventLog:
    """Appends one JSON line per request event while a profile is running."""

    def __init__(self) -> None:
        self._file = None
        self.path: str | None = None

    @property
    def active(self) -> bool:
        return self._file is not None

    def start(self, directory: str) -> str:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"frontend-requests-{os.getpid()}-{time.time_ns()}.jsonl")
        self._file = open(self.path, "wb")
        self.record({"event": "profile_start", "monotonic": time.monotonic(), "wall": time.time()})
        return self.path

    def record(self, event: dict) -> None:
        if self._file is not None:
            self._file.write(orjson.dumps(event) + b"\n")

    def stop(self) -> str | None:
        if self._file is not None:
            self.record({"event": "profile_stop", "monotonic": time.monotonic(), "wall": time.time()})
            self._file.close()
            self._file = None
        return self.path
