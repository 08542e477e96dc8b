"""Microbenchmark: what picking a data-parallel engine costs the frontend per request.

Times `DPEngineClient.route` (the engines' load scores, the prefix hashes of the prompt's first blocks,
the longest-prefix lookup, the LRU update, the request-to-rank map) on prompts from the shared-prefix
workload, for each policy, with no engine running (routing never waits on one). Target: <= 50 us per
request with the prefix policy. It prints wall time and this thread's CPU time: on a shared, overloaded
machine the CPU time is the figure that does not count the time other processes held the core.

    python -m tools.bench_router [--prompt-len 1024] [--num-prefixes 16] [--dp 2]
"""

from __future__ import annotations

import random
import time

import click

from engine.client.dp_client import DPEngineClient
from engine.client.router import Router
from engine.config import EngineConfig


def prompts(num_prefixes: int, per_prefix: int, prompt_len: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(1, 30000) for _ in range(prefix_len)] for _ in range(num_prefixes)]
    out = [head + [rng.randrange(1, 30000) for _ in range(prompt_len - prefix_len)]
           for head in heads for _ in range(per_prefix)]
    rng.shuffle(out)
    return out


def time_routing(policy: str, dp: int, batch: list[list[int]], rounds: int) -> tuple[float, float]:
    """Microseconds per DPEngineClient.route call, wall and CPU (best of `rounds` passes over the batch)."""
    config = EngineConfig(load_format="fake", data_parallel_size=dp, data_parallel_routing=policy).finalize()
    client = DPEngineClient(config)
    best_wall = best_cpu = float("inf")
    for _ in range(rounds):
        client.router = Router(dp, config.block_size, policy, capacity_blocks=dp * 100_000)
        ids = [f"r{i}" for i in range(len(batch))]
        start, start_cpu = time.perf_counter(), time.thread_time()
        for request_id, tokens in zip(ids, batch, strict=True):
            client.route(request_id, tokens, None, None)
        wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
        client._where.clear()
        best_wall = min(best_wall, wall / len(batch) * 1e6)
        best_cpu = min(best_cpu, cpu / len(batch) * 1e6)
    return best_wall, best_cpu


@click.command()
@click.option("--dp", default=2, show_default=True, type=int, help="Data-parallel engines.")
@click.option("--num-prefixes", default=16, show_default=True, type=int)
@click.option("--per-prefix", default=8, show_default=True, type=int)
@click.option("--prompt-len", default=1024, show_default=True, type=int)
@click.option("--prefix-len", default=768, show_default=True, type=int)
@click.option("--rounds", default=20, show_default=True, type=int)
def cli(dp: int, num_prefixes: int, per_prefix: int, prompt_len: int, prefix_len: int, rounds: int) -> None:
    """Per-request routing cost in the frontend, by policy."""
    batch = prompts(num_prefixes, per_prefix, prompt_len, prefix_len)
    click.echo(f"{len(batch)} prompts of {prompt_len} tokens ({num_prefixes} prefixes of {prefix_len}), dp={dp}")
    for policy in ("prefix", "load", "round_robin"):
        wall, cpu = time_routing(policy, dp, batch, rounds)
        click.echo(f"  {policy:<12} {wall:7.2f} us/request wall, {cpu:7.2f} us CPU (best of {rounds})")


if __name__ == "__main__":
    cli()
