"""Benchmark: the scheduler's CPU cost per engine step, at steady-state decode.

One cycle is what the scheduler process spends on a step besides waiting for the executors:
`schedule()` (building the SchedulerOutput) plus `update_from_output()` (appending the sampled tokens,
the stop checks, building the EngineOutputs with its stats). The model is a stand-in that returns one
token per request that reached the end of its tokens; its own cost is not counted. The msgpack encoding
of both messages, which the rings add, is reported beside it.

Prompt lengths are spread over [prompt_len/2, 3*prompt_len/2] so that requests cross block boundaries on
different steps, as they do in service; `--same-length` makes them all cross on the same step (worst case
for the p99: every request allocates a block and hashes a full one at once).

Run: python -m frontend.cli bench scheduler [--batch-sizes 64,256,1024] [--steps 2000]
"""

from __future__ import annotations

import gc
import os
import statistics
import time

import click
import numpy as np

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.messages import (
    HANDLE,
    TOKEN,
    AddRequest,
    Codec,
    EngineOut,
    ExecutorIn,
    ModelRunnerOutput,
    SchedulerOutput,
    pack,
    unpack,
)
from engine.sampling_params import SamplingParams

TARGETS_MS = {256: 0.5, 1024: 2.0}


class DecodeStandIn:
    """Returns a token for every request whose scheduled chunk reaches the end of its known tokens."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.remaining: dict[int, int] = {}       # tokens known to the executor but not yet computed
        self.rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        for handle in unpack(so.finished_reqs, HANDLE).tolist():
            del self.remaining[handle]
        for new in so.new_reqs:
            num_tokens = (len(new.prompt_token_ids) + len(new.output_token_ids)) // TOKEN.itemsize
            self.remaining[new.req] = num_tokens - new.num_computed_tokens
        sampled = []
        counts = unpack(so.num_scheduled_tokens, TOKEN).tolist()
        for handle, n in zip(unpack(so.reqs, HANDLE).tolist(), counts, strict=True):
            left = self.remaining[handle] - n
            if left == 0:
                sampled.append(handle)
                left = 1
            self.remaining[handle] = left
        tokens = self.rng.integers(1, self.vocab_size, size=len(sampled))
        return ModelRunnerOutput(step=so.step, reqs=pack(sampled, HANDLE),
                                 sampled_token_ids=pack(tokens, TOKEN), logprobs=[], prompt_logprobs=[])


def measure(batch_size: int, steps: int, prompt_len: int, block_size: int, same_length: bool = False,
            gc_freeze: bool = True) -> dict[str, float]:
    rng = np.random.default_rng(1)
    if same_length:
        lengths = np.full(batch_size, prompt_len)
    else:
        lengths = rng.integers(max(1, prompt_len // 2), prompt_len * 3 // 2 + 1, size=batch_size)
    # A budget that prefills every prompt in the first step; decode steps never reach it, so it does not
    # change what is measured.
    budget = int(lengths.sum()) + batch_size
    max_tokens = steps + 16         # nobody finishes while the clock runs
    max_model_len = int(lengths.max()) + max_tokens + 1
    config = EngineConfig(block_size=block_size, max_model_len=max_model_len, max_num_seqs=batch_size,
                          max_num_batched_tokens=budget)
    scheduler = Scheduler(config, batch_size * -(-max_model_len // block_size) + 1)
    model = DecodeStandIn(vocab_size=32000)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True).resolved()
    for handle, length in enumerate(lengths):
        prompt = rng.integers(1, 32000, size=int(length))
        scheduler.add_request(AddRequest(req=handle, prompt_token_ids=pack(prompt, TOKEN), params=params,
                                         eos_token_ids=[2], arrival_time=time.monotonic()))
    # Warm up until a step is pure decode: every request running, one token each.
    so = None
    while so is None or so.total_num_scheduled_tokens != batch_size or len(scheduler.running) != batch_size:
        so = scheduler.schedule()
        scheduler.update_from_output(so, model.execute_model(so))
    if gc_freeze:
        gc.collect()
        gc.freeze()

    to_executor, to_frontend = Codec(ExecutorIn), Codec(EngineOut)
    wall, cpu, encode = [], [], []
    clock, cpu_clock = time.perf_counter, time.thread_time
    try:
        for _ in range(steps):
            t0, c0 = clock(), cpu_clock()
            so = scheduler.schedule()
            t1, c1 = clock(), cpu_clock()
            ro = model.execute_model(so)
            t2, c2 = clock(), cpu_clock()
            out = scheduler.update_from_output(so, ro)
            t3, c3 = clock(), cpu_clock()
            to_executor.encode(so)
            to_frontend.encode(out)
            encode.append(clock() - t3)
            wall.append((t1 - t0) + (t3 - t2))
            cpu.append((c1 - c0) + (c3 - c2))
            if so.total_num_scheduled_tokens != batch_size:
                raise RuntimeError("the benchmark left steady-state decode")
    finally:
        if gc_freeze:
            gc.unfreeze()
    wall_ms, cpu_ms = np.array(wall) * 1e3, np.array(cpu) * 1e3
    return {
        "mean_ms": float(wall_ms.mean()),
        "p50_ms": float(np.percentile(wall_ms, 50)),
        "p99_ms": float(np.percentile(wall_ms, 99)),
        "cpu_mean_ms": float(cpu_ms.mean()),
        "cpu_p99_ms": float(np.percentile(cpu_ms, 99)),
        "per_req_us": float(wall_ms.mean() * 1e3 / batch_size),
        "encode_ms": statistics.fmean(encode) * 1e3,
    }


@click.command()
@click.option("--batch-sizes", default="64,256,1024", show_default=True,
              help="Comma-separated numbers of running decode requests.")
@click.option("--steps", default=2000, show_default=True, help="Timed steps per batch size.")
@click.option("--prompt-len", default=128, show_default=True, help="Mean prompt length.")
@click.option("--block-size", default=16, show_default=True)
@click.option("--same-length", is_flag=True, help="All prompts prompt-len long (blocks fill in lockstep).")
@click.option("--gc-freeze/--no-gc-freeze", default=True, show_default=True,
              help="gc.freeze() after warm-up, as an engine process should after startup.")
def cli(batch_sizes: str, steps: int, prompt_len: int, block_size: int, same_length: bool,
        gc_freeze: bool) -> None:
    """Mean and p99 time of one schedule() + update_from_output() cycle at steady-state decode."""
    sizes = [int(s) for s in batch_sizes.split(",") if s.strip()]
    click.echo(f"scheduler cycle = schedule() + update_from_output(), decode only, block_size {block_size}, "
               f"{steps} steps, prompts {'all' if same_length else 'around'} {prompt_len} tokens, "
               f"gc.freeze {'on' if gc_freeze else 'off'}")
    click.echo("wall: perf_counter; cpu: this thread's CPU time (leaves out time other processes had the core)")
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.5 * cores:
        click.echo(f"note: the machine is busy (load {load:.1f} on {cores} cores); wall figures include time "
                   "this process waited for a core, the cpu columns do not")
    click.echo(f"{'running':>8} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7} {'cpu mean':>8} {'cpu p99':>8} "
               f"{'us/req':>7} {'target':>6} {'verdict':>8} {'msgpack ms':>10}")
    for size in sizes:
        r = measure(size, steps, prompt_len, block_size, same_length, gc_freeze)
        target = TARGETS_MS.get(size)
        verdict = "-" if target is None else ("ok" if r["mean_ms"] <= target else "OVER")
        target_text = "-" if target is None else f"{target:.1f}"
        click.echo(f"{size:>8} {r['mean_ms']:>8.3f} {r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f} "
                   f"{r['cpu_mean_ms']:>8.3f} {r['cpu_p99_ms']:>8.3f} {r['per_req_us']:>7.2f} "
                   f"{target_text:>6} {verdict:>8} {r['encode_ms']:>10.3f}")
