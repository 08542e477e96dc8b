"""Prefix-aware vs round-robin placement across data-parallel engines, in one run.

For each routing policy it starts `ringserve serve -dp N --data-parallel-routing POLICY` (the fake model by
default: engine cost only), runs the same `bench serve` shared-prefix workload against it (the
`prefix_repetition` dataset: 16 prefixes x 8 requests by default), and prints the server's prefix-cache hit
rate next to the best any placement could reach on that workload, with TTFT and throughput.

The best possible rate replays the requests in dispatch order through one unbounded prefix cache keyed by
the scheduler's own block hashes (engine.block_hash): a request can reuse at most the full blocks that some
earlier request computed, never its last token. Placement across N engines can only lose hits against it.

    python -m tools.bench_dp_routing [--dp 2] [--num-prompts 128] [--num-prefixes 16] [--prefix-len 768]
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading

import click
import httpx

from engine.block_hash import prefix_block_hashes
from tools.bench_datasets import SampleRequest, sample_prefix_repetition
from tools.bench_serve import BenchSettings, load_bench_tokenizer, run_benchmark

SERVING = re.compile(r"serving (\S+) on (http://\S+)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Server:
    """`ringserve serve ... --port 0` as a child process, until stop()."""

    def __init__(self, args: list[str], timeout: float = 300.0) -> None:
        env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", *args, "--host", "127.0.0.1",
                                      "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.url: str | None = None
        ready = threading.Event()
        lines: list[str] = []

        def pump() -> None:
            for line in self.proc.stdout:
                lines.append(line)
                match = SERVING.search(line)
                if match and self.url is None:
                    self.url = match.group(2)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or self.url is None:
            self.stop()
            raise click.ClickException("the server did not start:\n" + "".join(lines[-30:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def best_hit_rate(tokenizer, requests: list[SampleRequest], block_size: int) -> float:
    """Prompt tokens an ideal placement finds cached / prompt tokens, for requests in dispatch order
    (request 0 is also sent once first, unmeasured, by bench serve)."""
    seen: set[bytes] = set()
    hits = queries = 0
    for i, request in enumerate([requests[0], *requests]):
        ids = tokenizer.encode(request.prompt, add_special_tokens=True)
        hashes = prefix_block_hashes(ids, block_size)
        usable = (len(ids) - 1) // block_size
        found = 0
        while found < min(usable, len(hashes)) and hashes[found] in seen:
            found += 1
        seen.update(hashes)
        if i:                                   # the warm-up request is not measured
            hits += found * block_size
            queries += len(ids)
    return hits / queries


@click.command()
@click.argument("model", required=False, default="ringserve-demo")
@click.option("--dp", default=2, show_default=True, type=int, help="Data-parallel engines.")
@click.option("--load-format", default="fake", show_default=True)
@click.option("--policies", default="prefix,round_robin", show_default=True)
@click.option("--num-prompts", default=128, show_default=True, type=int)
@click.option("--num-prefixes", default=16, show_default=True, type=int)
@click.option("--prefix-len", default=768, show_default=True, type=int, help="Shared tokens per prefix.")
@click.option("--suffix-len", default=64, show_default=True, type=int, help="Own tokens per prompt.")
@click.option("--output-len", default=32, show_default=True, type=int)
@click.option("--max-concurrency", default=4, show_default=True, type=int)
@click.option("--request-rate", default=float("inf"), show_default=True, type=float)
@click.option("--block-size", default=16, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
def cli(model: str, dp: int, load_format: str, policies: str, num_prompts: int, num_prefixes: int, prefix_len: int,
        suffix_len: int, output_len: int, max_concurrency: int, request_rate: float, block_size: int,
        seed: int) -> None:
    """Prefix-cache hit rate and TTFT of each data-parallel routing policy on one shared-prefix workload."""
    rows = []
    requests = tokenizer = None
    for policy in [p.strip() for p in policies.split(",") if p.strip()]:
        args = [*([model] if model else []), "-dp", str(dp), "--load-format", load_format,
                "--data-parallel-routing", policy, "--block-size", str(block_size)]
        server = Server(args)
        try:
            if tokenizer is None:
                root = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["root"]
                tokenizer = load_bench_tokenizer(root, root)
                requests = sample_prefix_repetition(tokenizer, num_prompts, num_prefixes, prefix_len, suffix_len,
                                                    output_len, seed)
                best = best_hit_rate(tokenizer, requests, block_size)
            settings = BenchSettings(base_url=server.url, max_concurrency=max_concurrency, request_rate=request_rate,
                                     disable_tqdm=True, seed=seed, metric_percentiles=[50.0, 99.0])
            result = asyncio.run(run_benchmark(settings, requests=requests, tokenizer=tokenizer))
        finally:
            server.stop()
        ttft = result.stats["ttft"]
        rows.append((policy, result.server_prefix_cache_hit_rate, ttft.mean, dict(ttft.percentiles),
                     result.request_throughput, result.failed))
    click.echo(f"dp={dp}, {load_format} model, {num_prompts} requests = {num_prefixes} prefixes x "
               f"{num_prompts // num_prefixes}, prefix {prefix_len} + suffix {suffix_len} tokens, output {output_len}, "
               f"concurrency {max_concurrency}; best possible hit rate {best:.3f}")
    click.echo(f"{'policy':<12} {'hit rate':>9} {'vs best':>8} {'TTFT mean':>10} {'p50':>8} {'p99':>8} "
               f"{'req/s':>7} {'failed':>6}")
    for policy, rate, mean, pct, throughput, failed in rows:
        rate_text = "n/a" if rate is None else f"{rate:.3f}"
        gap = "n/a" if rate is None else f"{rate - best:+.3f}"
        click.echo(f"{policy:<12} {rate_text:>9} {gap:>8} {mean:>8.2f}ms {pct[50.0]:>6.2f}ms {pct[99.0]:>6.2f}ms "
                   f"{throughput:>7.2f} {failed:>6}")


if __name__ == "__main__":
    cli()
