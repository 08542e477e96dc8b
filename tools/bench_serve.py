"""`ringserve bench serve`: a load generator against any OpenAI-compatible server.

It sends synthetic prompts (tools.bench_datasets) as streamed completions or chat requests, or single
sentences to /v1/embeddings (`--endpoint embeddings` or `/v1/embeddings`: request throughput and E2EL), at Poisson
(or gamma, --burstiness) arrivals or all at once, under an optional concurrency cap, and reports what
`vllm bench serve` reports with the same definitions (tools.bench_metrics), so that figures taken against
ringserve and against vLLM compare directly.

The library entry points are `run_benchmark(settings) -> BenchResult` and `format_result(result)`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime

import click
import httpx
import numpy as np
import orjson
from tqdm import tqdm

from frontend.cli.options import model_argument
from tools.bench_client import ENDPOINT_PATHS, RequestRecord, build_payload, send_request
from tools.bench_datasets import (
    DATASETS,
    SampleRequest,
    sample_code_requests,
    sample_prefix_repetition,
    sample_requests,
    sample_sentences,
)
from tools.bench_metrics import METRICS, BenchResult, calculate_metrics, format_result, parse_goodput

__all__ = ["BenchSettings", "BenchResult", "run_benchmark", "format_result", "arrival_offsets", "cli"]

READY_RETRY_S = 1.0
ENDPOINT_NAMES = {path: name for name, path in ENDPOINT_PATHS.items()}
BACKENDS = {"completions": "openai", "chat": "openai-chat", "embeddings": "openai-embeddings"}   # vLLM's names
# The default constraint of structured requests: any JSON object (xgrammar's builtin JSON grammar, vLLM's
# json_object). From random or real weights it keeps constraining every step, mostly inside strings.
STRUCTURED_OUTPUT = {"structured_outputs": {"json_object": True}}


class BenchError(RuntimeError):
    """The benchmark cannot run (server unreachable, first request fails, no tokenizer, ...)."""


@dataclass(slots=True, kw_only=True)
class BenchSettings:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first model the server lists at /v1/models
    served_model_name: str | None = None  # the name sent in requests, when it differs from model
    endpoint: str = "completions"  # completions | chat | embeddings (or the route: /v1/embeddings, ...)
    tokenizer: str | None = None  # local directory; default: model, when it is a directory
    dataset: str | None = None  # random | prefix | prefix_repetition | sentences; None: sentences for
    # embeddings, random otherwise
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    prefix_len: int = 0  # shared prefix tokens; the prefix datasets need > 0
    num_prefixes: int = 16  # prefix_repetition: how many different prefixes (prompts split evenly)
    request_rate: float = math.inf  # requests/s; inf sends all at once
    burstiness: float = 1.0  # gamma shape of the gaps; 1 is Poisson
    max_concurrency: int | None = None
    ignore_eos: bool = True  # vLLM forces it for synthetic data, so lengths hold
    seed: int = 0
    metric_percentiles: list[float] = field(default_factory=lambda: [99.0])
    percentile_metrics: list[str] | None = None  # None: every metric; E2EL alone for embeddings
    goodput: dict[str, float] = field(default_factory=dict)  # SLOs in ms: ttft, tpot, e2el
    num_warmups: int = 0
    disable_tqdm: bool = False
    api_key: str | None = None
    request_timeout_s: float = 6 * 3600.0
    ready_check_timeout_s: float = 600.0  # how long to wait for a server that is still starting
    # Share of requests (0..1) that carry STRUCTURED_OUTPUT, spread evenly over the run (vLLM's
    # --structured-output-ratio); `structured_output` replaces the constraint.
    structured_output_ratio: float = 0.0
    structured_output: dict = field(default_factory=lambda: dict(STRUCTURED_OUTPUT))

    def __post_init__(self) -> None:
        self.endpoint = ENDPOINT_NAMES.get(self.endpoint, self.endpoint)
        embeddings = self.endpoint == "embeddings"
        if self.dataset is None:
            self.dataset = "sentences" if embeddings else "random"
        if self.percentile_metrics is None:
            self.percentile_metrics = ["e2el"] if embeddings else list(METRICS)
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINT_PATHS)}, got {self.endpoint!r}")
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.dataset in ("prefix", "prefix_repetition") and self.prefix_len < 1:
            raise ValueError(f"the {self.dataset} dataset needs --prefix-len N with N > 0")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf sends all at once), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if not 0.0 <= self.structured_output_ratio <= 1.0:
            raise ValueError(f"structured_output_ratio must be in [0, 1], got {self.structured_output_ratio:g}")
        if self.num_warmups < 0:
            raise ValueError(f"num_warmups must not be negative, got {self.num_warmups}")
        for p in self.metric_percentiles:
            if not 0 < p <= 100:
                raise ValueError(f"percentiles must be in (0, 100], got {p:g}")
        for name in self.percentile_metrics:
            if name not in METRICS:
                raise ValueError(f"percentile metric {name!r} is not one of {', '.join(METRICS)}")
        parse_goodput([f"{k}:{v}" for k, v in self.goodput.items()])  # validates names and values


def arrival_offsets(
    num_requests: int, request_rate: float, burstiness: float, rng: np.random.Generator
) -> np.ndarray:
    """Send times in seconds after the start, as vLLM draws them: gamma gaps of mean 1/rate (shape
    `burstiness`; 1 is a Poisson process, inf is evenly spaced), rescaled so the last request goes out
    at exactly num_requests / rate. An infinite rate sends everything at once."""
    if math.isinf(request_rate):
        return np.zeros(num_requests)
    if math.isinf(burstiness):
        gaps = np.full(num_requests, 1.0 / request_rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    offsets = np.cumsum(gaps)
    return offsets * ((num_requests / request_rate) / offsets[-1])


async def run_benchmark(
    settings: BenchSettings, requests: list[SampleRequest] | None = None, tokenizer=None
) -> BenchResult:
    """Run one benchmark and return every figure.

    `requests` replaces the synthetic dataset (the settings' dataset options are then unused);
    `tokenizer` replaces loading settings.tokenizer. Without either, an output count the server does
    not report falls back to the number of token chunks.
    """
    base_url = settings.base_url.rstrip("/")
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    limits = httpx.Limits(
        max_connections=settings.max_concurrency, max_keepalive_connections=settings.max_concurrency
    )
    timeout = httpx.Timeout(settings.request_timeout_s, pool=None)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout, trust_env=False) as client:
        model, model_root = settings.model, None
        if model is None:
            model, model_root = await first_served_model(client, base_url)
        if tokenizer is None and (requests is None or settings.tokenizer):
            tokenizer = load_bench_tokenizer(settings.tokenizer or model_root, model)
        if requests is None and settings.dataset == "prefix_repetition":
            requests = sample_prefix_repetition(
                tokenizer,
                settings.num_prompts,
                settings.num_prefixes,
                settings.prefix_len,
                settings.random_input_len,
                settings.random_output_len,
                settings.seed,
            )
        elif requests is None and settings.dataset == "sentences":
            requests = sample_sentences(tokenizer, settings.num_prompts, settings.seed)
        elif requests is None and settings.dataset == "code":
            requests = sample_code_requests(tokenizer, settings.num_prompts, settings.random_output_len,
                                            settings.seed)
        elif requests is None:
            requests = sample_requests(
                tokenizer,
                settings.num_prompts,
                settings.random_input_len,
                settings.random_output_len,
                settings.random_range_ratio,
                settings.prefix_len,
                settings.seed,
            )
        if not requests:
            raise BenchError("no requests to send")
        url = base_url + ENDPOINT_PATHS[settings.endpoint]
        sent_model = settings.served_model_name or model
        structured = structured_mask(len(requests), settings.structured_output_ratio)
        payloads = [
            build_payload(settings.endpoint, sent_model, r.prompt, r.expected_output_len, settings.ignore_eos,
                          settings.structured_output if constrained else None)
            for r, constrained in zip(requests, structured, strict=True)
        ]

        async def send(i: int) -> RequestRecord:
            return await send_request(
                client, url, payloads[i], requests[i].prompt_len, settings.endpoint, settings.request_timeout_s
            )

        await _first_request(send, url, settings.ready_check_timeout_s)
        await _warm_up(send, settings.num_warmups, settings.max_concurrency)

        rng = np.random.default_rng([settings.seed, 1])  # its own stream, apart from the dataset's
        offsets = arrival_offsets(len(requests), settings.request_rate, settings.burstiness, rng)
        counters_before = await prefix_cache_counters(client, base_url)
        spec_before = await spec_decode_counters(client, base_url)
        gc.collect()
        gc.freeze()  # no collector pauses over the run's long-lived objects
        try:
            records, start, duration = await _dispatch(
                send, offsets, settings.max_concurrency, settings.disable_tqdm
            )
        finally:
            gc.unfreeze()
        counters_after = await prefix_cache_counters(client, base_url)
        spec_after = await spec_decode_counters(client, base_url)

    result = calculate_metrics(
        records, duration, start, tokenizer, settings.metric_percentiles, settings.goodput
    )
    result.percentile_metrics = list(settings.percentile_metrics)
    if counters_before is not None and counters_after is not None:
        queries = counters_after[1] - counters_before[1]
        if queries > 0:
            result.server_prefix_cache_hit_rate = (counters_after[0] - counters_before[0]) / queries
    if spec_before is not None and spec_after is not None:
        result.spec_decode = spec_decode_summary(spec_before, spec_after)
    result.run_info = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": BACKENDS[settings.endpoint],
        "backend": BACKENDS[settings.endpoint],
        "model_id": model,
        "tokenizer_id": getattr(tokenizer, "name_or_path", None),
        "num_prompts": len(requests),
        "request_rate": "inf" if math.isinf(settings.request_rate) else settings.request_rate,
        "burstiness": settings.burstiness,
        "max_concurrency": settings.max_concurrency,
        "structured_output_ratio": settings.structured_output_ratio,
    }
    return result


def structured_mask(num_requests: int, ratio: float) -> list[bool]:
    """Which requests carry the constraint: round(ratio * n) of them, spread evenly (request i is
    constrained when floor((i + 1) * ratio) > floor(i * ratio))."""
    return [math.floor((i + 1) * ratio + 1e-9) > math.floor(i * ratio + 1e-9) for i in range(num_requests)]


def format_structured_table(results: list[tuple[float, BenchResult]]) -> str:
    """Output tokens/s at each structured share, beside the unconstrained run (the first ratio 0)."""
    base = next((r.output_throughput for ratio, r in results if ratio == 0.0), None)
    lines = ["structured outputs: output throughput by share of constrained requests",
             f"{'structured':>10} {'output tok/s':>13} {'vs 0 %':>8} {'req/s':>8} {'mean TPOT ms':>13}"]
    for ratio, r in results:
        change = f"{(r.output_throughput / base - 1) * 100:+.1f}%" if base else "n/a"
        lines.append(f"{ratio * 100:>9.0f}% {r.output_throughput:>13.1f} {change:>8} "
                     f"{r.request_throughput:>8.2f} {r.stats['tpot'].mean:>13.2f}")
    return "\n".join(lines)


async def _dispatch(send, offsets: np.ndarray, max_concurrency: int | None, disable_tqdm: bool):
    """Send request i at offsets[i] (holding a concurrency slot while it runs); returns the records in
    order, the start time and the duration up to the last completion."""
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    progress = tqdm(total=len(offsets), disable=disable_tqdm)

    async def one(i: int) -> RequestRecord:
        arrival = time.perf_counter()
        if slots is None:
            record = await send(i)
        else:
            async with slots:
                record = await send(i)
        record.queue_time = record.start_time - arrival
        progress.update(1)
        return record

    tasks = []
    start = time.perf_counter()
    for i, offset in enumerate(offsets.tolist()):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    records = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    progress.close()
    return records, start, duration


async def _first_request(send, url: str, ready_timeout_s: float) -> None:
    """One unmeasured request with the first prompt: waits for a server that is still starting (refused
    connections) up to ready_timeout_s, and stops the run early on any other failure."""
    deadline = time.monotonic() + ready_timeout_s
    waiting = False
    while True:
        record = await send(0)
        if record.success:
            return
        if not record.error.startswith("ConnectError") or time.monotonic() >= deadline:
            raise BenchError(f"the first request to {url} failed: {record.error}")
        if not waiting:
            waiting = True
            print(f"waiting up to {ready_timeout_s:g} s for the server at {url} ...", file=sys.stderr)
        await asyncio.sleep(READY_RETRY_S)


async def _warm_up(send, num_warmups: int, max_concurrency: int | None) -> None:
    """num_warmups unmeasured copies of the first request, under the same concurrency cap."""
    slots = asyncio.Semaphore(max_concurrency or max(num_warmups, 1))

    async def one() -> None:
        async with slots:
            await send(0)

    await asyncio.gather(*(one() for _ in range(num_warmups)))


async def _counters(client: httpx.AsyncClient, base_url: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """The server's Prometheus counters `names` (without prefix and _total), each summed over its engines
    (and, for a per-position counter, kept per `position` label as NAME[POSITION]), under ringserve's or
    vLLM's prefix; None when /metrics has none of them."""
    try:
        response = await client.get(base_url + "/metrics")
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    totals: dict[str, float] = {}
    for line in response.text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for prefix in ("ringserve:", "vllm:"):
            if not name.startswith(prefix) or not name.endswith("_total") or name[len(prefix):-6] not in names:
                continue
            key = name[len(prefix):-6]
            position = re.search(r'position="(\d+)"', line)
            if position:
                key = f"{key}[{position.group(1)}]"
            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals or None


async def prefix_cache_counters(client: httpx.AsyncClient, base_url: str) -> tuple[float, float] | None:
    """(prefix-cache hit tokens, looked-up tokens) so far, summed over the server's engines, from its
    Prometheus /metrics under ringserve's or vLLM's names; None when it has no such counters."""
    totals = await _counters(client, base_url, ("prefix_cache_hits", "prefix_cache_queries"))
    if totals is None:
        return None
    return totals.get("prefix_cache_hits", 0.0), totals.get("prefix_cache_queries", 0.0)


SPEC_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                 "spec_decode_num_accepted_tokens_per_pos")


async def spec_decode_counters(client: httpx.AsyncClient, base_url: str) -> dict[str, float] | None:
    """The server's speculative-decoding counters (vLLM's names), or None when it exposes none."""
    return await _counters(client, base_url, SPEC_COUNTERS)


def spec_decode_summary(before: dict[str, float], after: dict[str, float]) -> dict | None:
    """What the run's drafts came to, as `vllm bench serve` reports it: acceptance rate (accepted / draft
    tokens), mean acceptance length (1 + accepted / drafts: tokens a verify step yields), and the acceptance
    rate of each draft position; None when nothing was drafted."""
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    drafts, draft_tokens = delta.get("spec_decode_num_drafts", 0.0), delta.get("spec_decode_num_draft_tokens", 0.0)
    if drafts <= 0 or draft_tokens <= 0:
        return None
    accepted = delta.get("spec_decode_num_accepted_tokens", 0.0)
    positions = sorted(int(key[key.index("[") + 1:-1]) for key in delta if key.endswith("]"))
    return {
        "drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted_tokens": int(accepted),
        "acceptance_rate": accepted / draft_tokens, "acceptance_length": 1.0 + accepted / drafts,
        "per_position_acceptance": [delta[f"spec_decode_num_accepted_tokens_per_pos[{p}]"] / drafts
                                    for p in positions],
    }


async def first_served_model(client: httpx.AsyncClient, base_url: str) -> tuple[str, str | None]:
    """The id of the first model the server lists at /v1/models, and its `root` (vLLM puts the model's
    path there) when that is a local directory or GGUF file, to find the tokenizer."""
    try:
        response = await client.get(base_url + "/v1/models")
        response.raise_for_status()
        entry = response.json()["data"][0]
        root = entry.get("root")
        return entry["id"], _tokenizer_source(root) if isinstance(root, str) else None
    except (httpx.HTTPError, KeyError, IndexError, ValueError, AttributeError) as e:
        raise BenchError(
            f"cannot read the served model from {base_url}/v1/models ({e}); pass --model"
        ) from None


def _local_model(path: str) -> bool:
    return os.path.isdir(path) or (path.lower().endswith(".gguf") and os.path.isfile(path))


def _tokenizer_source(model: str) -> str | None:
    """Where `model`'s tokenizer is on this machine: a local directory or GGUF file as named, or the file of a
    built-in name (a server shows the bundled model by its name, not its path); None when it is elsewhere."""
    from engine.config import DEMO_NAME, EngineConfig
    from engine.models.bundled import MINILM_NAME, SMOLLM2_NAME, find_minilm, find_smollm2

    if _local_model(model):
        return model
    if model == SMOLLM2_NAME:
        return find_smollm2()
    if model == MINILM_NAME and find_minilm():
        return EngineConfig(model=MINILM_NAME).finalize().model        # the directory its zip unpacks to
    if model == DEMO_NAME:
        from engine.models.demo import ensure_demo_model

        return ensure_demo_model()
    return None


def load_bench_tokenizer(path: str | None, model: str):
    """The tokenizer at `path`, or at `model` when that is a local directory or GGUF file; never downloads."""
    from engine.client.tokenizer import load_tokenizer
    from engine.config import EngineConfig

    path = path or _tokenizer_source(model)
    if path is None:
        raise BenchError(f"no tokenizer: the model {model!r} is not a local directory, GGUF file or built-in "
                         "name; pass --tokenizer PATH")
    return load_tokenizer(EngineConfig(tokenizer=path))


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"percentiles must be comma-separated numbers (e.g. 50,90,99), got {text!r}"
        ) from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--base-url", default="http://127.0.0.1:8000", show_default=True, help="The server's base URL.")
@model_argument(default=None, help="Model name sent in requests (default: the server's first model).")
@click.option("--served-model-name", default=None, help="Name sent in requests when --model is a path.")
@click.option("--endpoint", type=click.Choice([*ENDPOINT_PATHS, *ENDPOINT_NAMES]), default="completions",
              show_default=True, help="What to send: streamed completions or chat, or embeddings of single sentences.")
@click.option(
    "--tokenizer", default=None, help="Local tokenizer directory (default: --model if a directory)."
)
@click.option("--dataset-name", "dataset", type=click.Choice(DATASETS), default=None,
              help="Default: sentences for embeddings, random otherwise.")
@click.option("--num-prompts", default=1000, show_default=True, type=int)
@click.option("--random-input-len", "--input-len", default=1024, show_default=True, type=int)
@click.option("--random-output-len", "--output-len", default=128, show_default=True, type=int)
@click.option("--random-range-ratio", default=0.0, show_default=True, type=float)
@click.option(
    "--prefix-len",
    "--random-prefix-len",
    default=0,
    show_default=True,
    type=int,
    help="Tokens of one prefix shared by every prompt (the prefix dataset needs > 0).",
)
@click.option(
    "--num-prefixes",
    "--prefix-repetition-num-prefixes",
    default=16,
    show_default=True,
    type=int,
    help="prefix_repetition: different prefixes, each shared by num-prompts / num-prefixes prompts.",
)
@click.option(
    "--request-rate", default="inf", show_default=True, type=float, help="Requests/s; inf: all at once."
)
@click.option("--burstiness", default=1.0, show_default=True, type=float, help="Gamma shape of arrival gaps.")
@click.option("--max-concurrency", default=None, type=int, help="Most requests in flight at once.")
@click.option(
    "--ignore-eos/--no-ignore-eos",
    default=True,
    show_default=True,
    help="Send ignore_eos so outputs run to their length (vLLM's default for synthetic data).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--metric-percentiles", "--percentiles", default="99", show_default=True, help="E.g. 50,90,99.")
@click.option("--percentile-metrics", default=None, help=f"Default: {','.join(METRICS)} (e2el for embeddings).")
@click.option(
    "--goodput", multiple=True, help="SLOs as NAME:MS (ttft, tpot, e2el); repeat or space-separate."
)
@click.option("--warmup", "--num-warmups", "num_warmups", default=0, show_default=True, type=int)
@click.option("--disable-tqdm", is_flag=True)
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None, help="Bearer token [env: OPENAI_API_KEY].")
@click.option("--request-timeout", "request_timeout_s", default=6 * 3600.0, type=float, show_default=True)
@click.option(
    "--ready-check-timeout-sec", "ready_check_timeout_s", default=600.0, type=float, show_default=True
)
@click.option(
    "--structured-output-ratio",
    "structured_ratios",
    default="0",
    show_default=True,
    help="Share(s) of requests under a structured-outputs constraint, comma-separated (e.g. 0,0.2,0.8,1): "
    "one run per share, then a table of output tok/s beside the unconstrained run.",
)
@click.option(
    "--structured-output",
    "structured_output_json",
    default=None,
    help='The request fields of a constraint, as JSON (default: {"structured_outputs": {"json_object": true}}).',
)
@click.option("--result-json", type=click.Path(dir_okay=False), default=None, help="Write every figure here.")
def cli(
    result_json: str | None, metric_percentiles: str, percentile_metrics: str, goodput, structured_ratios: str,
    structured_output_json: str | None, **options
) -> None:
    """Benchmark an OpenAI-compatible server with vLLM's serving metrics."""
    try:
        ratios = _floats(structured_ratios) or [0.0]
        if structured_output_json is not None:
            options["structured_output"] = orjson.loads(structured_output_json)
        settings = BenchSettings(
            metric_percentiles=_floats(metric_percentiles),
            percentile_metrics=[m.strip() for m in percentile_metrics.split(",") if m.strip()]
            if percentile_metrics else None,
            goodput=parse_goodput(goodput),
            structured_output_ratio=ratios[0],
            **options,
        )
        for ratio in ratios:
            dataclasses.replace(settings, structured_output_ratio=ratio)   # validates each share
    except (ValueError, orjson.JSONDecodeError) as e:
        raise click.UsageError(str(e)) from None
    if len(ratios) > 1:
        _run_structured_shares(settings, ratios, result_json)
        return
    rate = "inf (all at once)" if math.isinf(settings.request_rate) else f"{settings.request_rate:g} req/s"
    click.echo(
        f"{settings.num_prompts} {settings.dataset} prompts to {settings.base_url} ({settings.endpoint}); "
        f"rate {rate}, burstiness {settings.burstiness:g}, max concurrency {settings.max_concurrency}"
    )
    try:
        result = asyncio.run(run_benchmark(settings))
    except (BenchError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(format_result(result))
    if result_json:
        with open(result_json, "wb") as f:
            f.write(orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2))


def _run_structured_shares(settings: BenchSettings, ratios: list[float], result_json: str | None) -> None:
    """One run per structured share, against the same server, then the comparison table. One unmeasured
    constrained request goes first, so that no share pays the server's one-time grammar setup (loading
    xgrammar and the vocabulary) or the first compile."""
    results = []
    if any(ratio > 0 for ratio in ratios):
        warm = dataclasses.replace(settings, num_prompts=1, structured_output_ratio=1.0, num_warmups=0,
                                   disable_tqdm=True)
        try:
            asyncio.run(run_benchmark(warm))
        except (BenchError, ValueError) as e:
            raise click.ClickException(str(e)) from None
    for ratio in ratios:
        run_settings = dataclasses.replace(settings, structured_output_ratio=ratio)
        click.echo(f"--- {ratio * 100:g} % structured")
        try:
            result = asyncio.run(run_benchmark(run_settings))
        except (BenchError, ValueError) as e:
            raise click.ClickException(str(e)) from None
        click.echo(format_result(result))
        results.append((ratio, result))
    click.echo(format_structured_table(results))
    if result_json:
        with open(result_json, "wb") as f:
            f.write(orjson.dumps([r.to_dict() for _, r in results], option=orjson.OPT_INDENT_2))
