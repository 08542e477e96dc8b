"""`ringserve bench spec-cost`: what a verify step costs against a decode step, by batch size: the crossover
behind speculative decoding's `disable_by_batch_size`.

For each batch size B it times the bare model's forward plus logits (the path the executor takes: the fused
C step on a CPU) for B requests with one new token (a decode step) and with 1 + k tokens (a verify step of
k drafts each), alternating, and prints the medians and their ratio. The ratio is the break-even acceptance
length: a verify step pays only while it yields more tokens per request than that (1 + accepted drafts;
`ringserve bench spec` and `bench serve` report the mean acceptance length a workload reaches).

    ringserve bench spec-cost --batches 1,2,4,8,16 --context 512 --num-speculative-tokens 4
"""

from __future__ import annotations

import statistics
import time

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--model", default="smollm2-135m-instruct")
@click.option("--batches", default="1,2,4,8,16")
@click.option("--context", type=int, default=512, help="Tokens each request has in the cache.")
@click.option("--num-speculative-tokens", "drafts", type=int, default=4)
@click.option("--rounds", type=int, default=9)
@click.option("--threads", type=int, default=None, help="torch threads (default: the executor's, all cores)")
def cli(model, batches, context, drafts, rounds, threads) -> None:
    """Decode against verify step time by batch size (bare model, no engine)."""
    import os

    import torch

    from engine.config import EngineConfig
    from engine.models.loader import load_model
    from tools.bench_model import uniform_batch

    torch.set_num_threads(threads or os.cpu_count() or 1)
    config = EngineConfig(model=model, max_model_len=context + drafts + 1).finalize()
    lm = load_model(config, device="cpu", progress=False)
    block_size = 16
    generator = torch.Generator().manual_seed(0)

    def step(batch: int, query: int, kv) -> float:
        seq_len = context + query
        ids = torch.randint(0, config.vocab_size, (batch * query,), generator=generator)
        positions = torch.arange(seq_len - query, seq_len).repeat(batch)
        metadata = uniform_batch(batch, query, seq_len, block_size)
        start = time.perf_counter()
        lm.compute_logits(lm(ids, positions, kv, metadata))
        return time.perf_counter() - start

    click.echo(f"{model} ({config.resolved_dtype}), {torch.get_num_threads()} threads, {context}-token context, "
               f"k = {drafts}; fused CPU step: {'yes' if lm.cpu_decode is not None else 'no'}")
    click.echo(f"{'batch':>5} {'decode ms':>10} {'verify ms':>10} {'ratio':>6}   (break-even acceptance length)")
    with torch.inference_mode():
        for batch in [int(b) for b in batches.split(",")]:
            blocks = 1 + batch * -(-(context + drafts + 1) // block_size)
            kv = [torch.zeros(2, blocks, block_size, lm.num_kv_heads, lm.head_dim, dtype=lm.dtype)
                  for _ in range(lm.num_layers)]
            times: dict[int, list[float]] = {1: [], 1 + drafts: []}
            for query in times:
                step(batch, query, kv)                          # warm up
            for _ in range(rounds):
                for query in times:
                    times[query].append(step(batch, query, kv))
            decode, verify = (statistics.median(times[q]) * 1e3 for q in times)
            click.echo(f"{batch:>5} {decode:>10.2f} {verify:>10.2f} {verify / decode:>6.2f}")


if __name__ == "__main__":
    cli()
