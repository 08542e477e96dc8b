"""The figures of `ringserve bench serve`, defined exactly as `vllm bench serve` defines them.

Over the successful requests only (a failed one counts as failed, never as fast):
- TTFT: from sending the request to the first token chunk.
- TPOT: (E2EL - TTFT) / (output tokens - 1), i.e. excluding the first token; only requests with more
  than one output token enter the TPOT statistics (goodput counts the others as TPOT 0).
- ITL: every gap between consecutive token chunks, pooled over all requests.
- E2EL: from sending the request to its last token chunk.
- Output tokens: the server's usage.completion_tokens; when absent (or 0), the re-tokenized text.
- Throughputs divide by the benchmark duration (first dispatch to last completion).
- Goodput: successful requests that meet every given SLO (value <= SLO), per second.
Percentiles are numpy's (linear interpolation); an empty metric reads 0, as vLLM prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from tools.bench_client import RequestRecord

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
NOT_IN_JSON = ("stats", "percentile_metrics", "run_info")  # stats go flat, as mean_ttft_ms, p99_ttft_ms, ...
METRIC_TITLES = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


@dataclass(slots=True)
class MetricStats:
    """One latency metric in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: list[tuple[float, float]]  # (percentile, value)

    @classmethod
    def of(cls, seconds: np.ndarray, percentiles: list[float]) -> MetricStats:
        ms = seconds * 1000.0 if seconds.size else np.zeros(1)
        return cls(
            mean=float(np.mean(ms)),
            median=float(np.median(ms)),
            std=float(np.std(ms)),
            percentiles=[(p, float(np.percentile(ms, p))) for p in percentiles],
        )


@dataclass(slots=True)
class BenchResult:
    """Every figure of one run; `to_dict()` is the --result-json content, with vLLM's keys."""

    duration: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None  # None without --goodput
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float  # peak of token chunks per one-second bucket
    max_concurrent_requests: int
    stats: dict[str, MetricStats]  # "ttft", "tpot", "itl", "e2el"
    # per request, in dispatch order (failed requests included, their output_lens 0)
    input_lens: list[int]
    output_lens: list[int]
    ttfts: list[float]
    itls: list[list[float]]
    latencies: list[float]
    start_times: list[float]  # seconds after the benchmark started
    queue_times: list[float]
    generated_texts: list[str]
    errors: list[str]
    # how the run was made (filled in by run_benchmark)
    percentile_metrics: list[str] = field(default_factory=lambda: list(METRICS))
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    run_info: dict = field(default_factory=dict)
    # the server's own prefix-cache hit rate over the run (prompt tokens found / looked up, from the
    # vLLM-named counters in its /metrics, summed over engines); None when it exposes none
    server_prefix_cache_hit_rate: float | None = None
    spec_decode: dict | None = None     # tools.bench_serve.spec_decode_summary, when the server drafted

    def to_dict(self) -> dict:
        out = dict(self.run_info)
        for f in fields(self):
            if f.name not in NOT_IN_JSON:
                out[f.name] = getattr(self, f.name)
        for name, stat in self.stats.items():
            out[f"mean_{name}_ms"] = stat.mean
            out[f"median_{name}_ms"] = stat.median
            out[f"std_{name}_ms"] = stat.std
            for p, value in stat.percentiles:
                out[f"p{percentile_word(p)}_{name}_ms"] = value
        return out


def percentile_word(p: float) -> str:
    """99 -> "99", 99.9 -> "99.9" (vLLM's key spelling: p99_ttft_ms, p99.9_ttft_ms)."""
    return str(int(p)) if int(p) == p else str(p)


def parse_goodput(items: list[str] | tuple[str, ...]) -> dict[str, float]:
    """["ttft:200", "tpot:50"] (or space/comma separated in one item) -> {"ttft": 200.0, "tpot": 50.0} ms."""
    slos: dict[str, float] = {}
    for pair in " ".join(items).replace(",", " ").split():
        name, sep, value = pair.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise ValueError(f"goodput SLO {pair!r} is not NAME:MILLISECONDS (e.g. ttft:200)")
        if name not in GOODPUT_METRICS:
            raise ValueError(f"goodput SLO {name!r} is not one of {', '.join(GOODPUT_METRICS)}")
        if number < 0:
            raise ValueError(f"goodput SLO {pair!r} must not be negative")
        slos[name] = number
    return slos


def count_output_tokens(records: list[RequestRecord], tokenizer) -> list[int]:
    """Output tokens per request: usage when reported, else the re-tokenized text (0 for failures).

    Without a tokenizer an unreported count falls back to the number of token chunks."""
    counts = [r.output_tokens if r.success else 0 for r in records]
    missing = [i for i, r in enumerate(records) if r.success and r.generates and not r.output_tokens]
    if missing and tokenizer is not None:
        encoded = tokenizer([records[i].generated_text for i in missing], add_special_tokens=False).input_ids
        for i, ids in zip(missing, encoded, strict=True):
            counts[i] = len(ids)
    elif missing:
        for i in missing:
            counts[i] = len(records[i].token_times)
    return counts


def calculate_metrics(
    records: list[RequestRecord],
    duration: float,
    start: float,
    tokenizer,
    percentiles: list[float],
    goodput_slos_ms: dict[str, float] | None = None,
) -> BenchResult:
    """All figures of a run from its records; `start` is the perf_counter() time the run began."""
    output_lens = count_output_tokens(records, tokenizer)
    ok = [i for i, r in enumerate(records) if r.success]
    ttfts = np.array([records[i].ttft for i in ok])
    e2els = np.array([records[i].latency for i in ok])
    ok_outputs = np.array([output_lens[i] for i in ok], dtype=np.int64)
    # TPOT per request; 0 for single-token outputs, which goodput accepts and the statistics skip
    multi = ok_outputs > 1
    all_tpots = np.zeros(len(ok))
    all_tpots[multi] = (e2els[multi] - ttfts[multi]) / (ok_outputs[multi] - 1)
    itls_per_request = [np.diff(r.token_times) for r in records]
    pooled_itls = np.concatenate([itls_per_request[i] for i in ok]) if ok else np.zeros(0)

    total_input = sum(records[i].prompt_len for i in ok)
    total_output = int(ok_outputs.sum())
    goodput = None
    if goodput_slos_ms:
        values = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        good = np.ones(len(ok), dtype=bool)
        for name, slo_ms in goodput_slos_ms.items():
            good &= values[name] <= slo_ms / 1000.0
        goodput = int(good.sum()) / duration
    peak_tokens, peak_concurrency = _peaks([records[i] for i in ok])

    return BenchResult(
        duration=duration,
        completed=len(ok),
        failed=len(records) - len(ok),
        total_input_tokens=total_input,
        total_output_tokens=total_output,
        request_throughput=len(ok) / duration,
        request_goodput=goodput,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_output_tokens_per_s=peak_tokens,
        max_concurrent_requests=peak_concurrency,
        stats={
            "ttft": MetricStats.of(ttfts, percentiles),
            "tpot": MetricStats.of(all_tpots[multi], percentiles),
            "itl": MetricStats.of(pooled_itls, percentiles),
            "e2el": MetricStats.of(e2els, percentiles),
        },
        input_lens=[r.prompt_len for r in records],
        output_lens=output_lens,
        ttfts=[r.ttft for r in records],
        itls=[gaps.tolist() for gaps in itls_per_request],
        latencies=[r.latency for r in records],
        start_times=[r.start_time - start for r in records],
        queue_times=[r.queue_time for r in records],
        generated_texts=[r.generated_text for r in records],
        errors=[r.error for r in records],
        goodput_slos_ms=dict(goodput_slos_ms or {}),
    )


def _peaks(records: list[RequestRecord]) -> tuple[float, int]:
    """vLLM's peak figures: the most token chunks in one one-second bucket (from the first start), and
    the most requests in flight at once (half-open [start, end) intervals)."""
    if not records:
        return 0.0, 0
    t0 = min(r.start_time for r in records)
    token_times = np.concatenate([np.asarray(r.token_times) for r in records]) - t0
    peak_tokens = float(np.bincount(token_times.astype(np.int64)).max())
    starts = np.array([r.start_time for r in records])
    ends = starts + np.array([r.latency for r in records])
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((deltas, times))  # at equal times, a departure before an arrival
    return peak_tokens, int(np.cumsum(deltas[order]).max())


def format_result(result: BenchResult) -> str:
    """The report `vllm bench serve` prints, line for line in its layout."""
    lines = []
    failures = [e for e in result.errors if e]
    if failures:
        lines.append(f"Failed requests (first {min(10, len(failures))} of {len(failures)} errors):")
        lines.extend(f"  error {i}: {e}" for i, e in enumerate(failures[:10]))
    info = result.run_info

    def row(label: str, value, fmt: str = "") -> None:
        lines.append(f"{label:<40} {value:<10{fmt}}")

    lines.append("{:=^50}".format(" Serving Benchmark Result "))
    row("Successful requests:", result.completed)
    row("Failed requests:", result.failed)
    if info.get("max_concurrency") is not None:
        row("Maximum request concurrency:", info["max_concurrency"])
    if info.get("request_rate", "inf") != "inf":
        row("Request rate configured (RPS):", info["request_rate"], ".2f")
    generates = info.get("backend") != "openai-embeddings"     # an embedding run has no output tokens
    row("Benchmark duration (s):", result.duration, ".2f")
    row("Total input tokens:", result.total_input_tokens)
    if generates:
        row("Total generated tokens:", result.total_output_tokens)
    row("Request throughput (req/s):", result.request_throughput, ".2f")
    if result.request_goodput is not None:
        row("Request goodput (req/s):", result.request_goodput, ".2f")
    if generates:
        row("Output token throughput (tok/s):", result.output_throughput, ".2f")
        row("Peak output token throughput (tok/s):", result.max_output_tokens_per_s, ".2f")
    row("Peak concurrent requests:", result.max_concurrent_requests, ".2f")
    row("Total token throughput (tok/s):", result.total_token_throughput, ".2f")
    if result.server_prefix_cache_hit_rate is not None:
        row("Server prefix cache hit rate:", result.server_prefix_cache_hit_rate, ".3f")
    spec = result.spec_decode
    if spec is not None:
        lines.append("{:-^50}".format("Speculative Decoding"))
        row("Acceptance rate (%):", 100 * spec["acceptance_rate"], ".2f")
        row("Acceptance length:", spec["acceptance_length"], ".2f")
        row("Drafts:", spec["drafts"])
        row("Draft tokens:", spec["draft_tokens"])
        row("Accepted tokens:", spec["accepted_tokens"])
        lines.append("Per-position acceptance (%):")
        lines.extend(f"  Position {p}:{100 * rate:>34.2f}" for p, rate in enumerate(spec["per_position_acceptance"]))
    for name in result.percentile_metrics:
        short, title = METRIC_TITLES[name]
        stat = result.stats[name]
        lines.append(f"{title:-^50}")
        row(f"Mean {short} (ms):", stat.mean, ".2f")
        row(f"Median {short} (ms):", stat.median, ".2f")
        for p, value in stat.percentiles:
            row(f"P{percentile_word(p)} {short} (ms):", value, ".2f")
    lines.append("=" * 50)
    return "\n".join(lines)
