"""What the processes and rings cost: per-step time with a zero-cost fake model, in-process vs multi-process.

With load_format="fake" the executor runs the whole per-step path (diff, persistent batch, input
preparation) but no model, so a step's time is pure engine overhead: scheduling, encoding, the rings, the
executor's bookkeeping, and the client turning outputs into deltas. Both modes run the same workload in
the same run: N requests decoding (short prompts, ignore_eos), timed over many steps once all are running.
A third column runs multi-process with async scheduling (the scheduler prepares step N+1 while the
executor runs step N), so the scheduler's own time is hidden behind the executor's instead of added to it.

    python -m tools.bench_engine_overhead [--json]
"""

from __future__ import annotations

import json
import sys
import time

import click

from engine.client.engine_client import EngineClient
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams


def measure(batch: int, in_process: bool, steps: int, model: str | None, async_scheduling: bool = False,
            fake_step_us: int = 0) -> dict:
    config = EngineConfig(model=model or "", load_format="fake", in_process=in_process, max_num_seqs=max(batch, 1),
                          max_num_batched_tokens=max(batch * 16, 256), max_model_len=2048,
                          async_scheduling=async_scheduling, fake_step_us=fake_step_us)
    client = EngineClient(config).start()
    try:
        params = SamplingParams(temperature=0.0, max_tokens=steps + 100, ignore_eos=True)
        for i in range(batch):
            client.add_request(f"r{i}", [1 + (i % 7)] * 16, params)
        seen = 0
        while seen < batch:                     # until every request has its first token
            seen += sum(1 for d in client.poll(timeout=5.0) if d.num_cached_tokens is not None)
        warm = 0
        while warm < 20 * batch:                # warm-up steps (counted in tokens: a poll may bring several)
            warm += sum(len(d.new_token_ids) for d in client.poll(timeout=5.0))
        times = []
        tokens = 0
        last = time.perf_counter()
        while tokens < steps * batch:         # a poll may bring several steps' tokens
            deltas = client.poll(timeout=5.0)
            now = time.perf_counter()
            if not client.num_unfinished:
                raise RuntimeError("the requests finished before the measurement did")
            if deltas:
                times.append(now - last)
                tokens += sum(len(d.new_token_ids) for d in deltas)
                last = now
        for i in range(batch):
            client.abort_request(f"r{i}")
    finally:
        client.shutdown_sync()
    times.sort()
    mean = sum(times) / (tokens / batch)        # per step: every running request gets one token a step
    return {"mode": "in-process" if in_process else "multi-process", "batch": batch,
            "step_us_mean": mean * 1e6, "step_us_p50": times[len(times) // 2] * 1e6,
            "step_us_p99": times[int(len(times) * 0.99)] * 1e6, "steps_per_s": 1 / mean,
            "tokens_per_s": tokens / sum(times)}


@click.command("engine-overhead")
@click.option("--batches", default="1,64,256", show_default=True)
@click.option("--steps", default=1500, show_default=True, help="at most 1900 (the demo model's context)")
@click.option("--model", default=None, help="config.json directory (default: the demo model)")
@click.option("--fake-step-us", default=0, show_default=True,
              help="the fake forward's time, slept as a CPU waiting for a GPU would (0: zero-cost)")
@click.option("--json", "as_json", is_flag=True)
def cli(batches: str, steps: int, model: str | None, fake_step_us: int, as_json: bool) -> None:
    """Per-step engine overhead with a zero-cost model, in-process vs multi-process, side by side."""
    rows = []
    for batch in [int(b) for b in batches.split(",")]:
        local = measure(batch, True, steps, model, fake_step_us=fake_step_us)
        remote = measure(batch, False, steps, model, fake_step_us=fake_step_us)
        overlapped = measure(batch, False, steps, model, async_scheduling=True, fake_step_us=fake_step_us)
        rows.append({"batch": batch, "in_process": local, "multi_process": remote, "async": overlapped,
                     "added_us": remote["step_us_mean"] - local["step_us_mean"],
                     "hidden_us": remote["step_us_mean"] - overlapped["step_us_mean"]})
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'running':>8} {'in-process us/step':>19} {'multi-process us/step':>22} {'p99':>8} "
               f"{'added us':>9} {'steps/s (mp)':>13} {'async us/step':>14} {'hidden us':>10}")
    for r in rows:
        a, b, c = r["in_process"], r["multi_process"], r["async"]
        click.echo(f"{r['batch']:>8} {a['step_us_mean']:>19.1f} {b['step_us_mean']:>22.1f} "
                   f"{b['step_us_p99']:>8.1f} {r['added_us']:>9.1f} {b['steps_per_s']:>13.0f} "
                   f"{c['step_us_mean']:>14.1f} {r['hidden_us']:>10.1f}")


if __name__ == "__main__":
    sys.exit(cli())
