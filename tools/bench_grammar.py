"""`ringserve bench grammar`: what structured outputs cost per decode step, against the batch size.

B matchers of one grammar (the builtin any-JSON-object grammar by default, or --schema FILE) stand at mixed
positions of random valid outputs; each measured step does what the engine does for B constrained rows:

  fill     GrammarManager.fill: one BatchGrammarMatcher call into the [B, W] int32 buffer (scheduler)
  wire     GrammarRows to bytes and through the broadcast codec (scheduler -> executors)
  apply    the executor's mask of [B, V] float32 logits (engine/sample/grammar_mask.py, this device)
  accept   matcher.accept_token for each row's sampled token (scheduler)

The sampled token is a random allowed one, so the walk stays inside the grammar. Medians over --steps
steps, in milliseconds per step and microseconds per row.
"""

from __future__ import annotations

import json
import time

import click
import numpy as np


def _matchers(compiled, batch: int, rng: np.random.Generator, warm_steps: int, vocab: int):
    import xgrammar as xgr

    matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
    buffer = np.empty((1, (vocab + 31) // 32), dtype=np.int32)
    for matcher in matchers:                     # mixed positions: each row walks a random distance
        for _ in range(int(rng.integers(0, warm_steps + 1))):
            _advance(matcher, buffer, rng, vocab)
    return matchers


def _advance(matcher, buffer: np.ndarray, rng: np.random.Generator, vocab: int) -> None:
    from engine.structured_spec import unpack_allowed

    if matcher.is_terminated():
        matcher.reset()
    matcher.fill_next_token_bitmask(buffer, 0)
    allowed = np.flatnonzero(unpack_allowed(buffer, vocab)[0])
    stops = set(matcher.stop_token_ids)
    choices = [t for t in allowed.tolist()[:4096] if t not in stops] or allowed.tolist()
    matcher.accept_token(int(choices[int(rng.integers(len(choices)))]))


def run(tokenizer_path: str, vocab_size: int | None, schema: str | None, batches: list[int], steps: int,
        warm_steps: int, seed: int) -> list[dict]:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from engine.messages import Codec, GrammarRows
    from engine.sample.grammar_mask import apply_bitmask
    from engine.structured_spec import unpack_allowed

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = info.vocab_size
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    compiled = compiler.compile_json_schema(schema) if schema else compiler.compile_builtin_json_grammar()
    codec = Codec(GrammarRows)
    rng = np.random.default_rng(seed)
    rows = []
    for batch in batches:
        matchers = _matchers(compiled, batch, rng, warm_steps, vocab)
        filler = xgr.BatchGrammarMatcher(1)
        bitmask = np.empty((batch, (vocab + 31) // 32), dtype=np.int32)
        logits = torch.randn(batch, vocab)
        index = torch.arange(batch)
        times = {"fill": [], "wire": [], "apply": [], "accept": []}
        for _ in range(steps):
            for m in matchers:
                if m.is_terminated():
                    m.reset()
            t0 = time.perf_counter()
            filler.batch_fill_next_token_bitmask(matchers, bitmask)
            t1 = time.perf_counter()
            message = codec.decode(codec.encode(GrammarRows(positions=np.arange(batch, dtype="<i4").tobytes(),
                                                            bitmask=bitmask.tobytes())))
            t2 = time.perf_counter()
            received = torch.from_numpy(np.frombuffer(message.bitmask, "<i4").reshape(batch, -1).copy())
            apply_bitmask(logits, received, index)
            t3 = time.perf_counter()
            allowed = unpack_allowed(bitmask, vocab)
            picks = [int(rng.choice(np.flatnonzero(row)[:4096])) for row in allowed]
            t4 = time.perf_counter()
            for m, token in zip(matchers, picks, strict=True):
                m.accept_token(token)
            t5 = time.perf_counter()
            for name, value in (("fill", t1 - t0), ("wire", t2 - t1), ("apply", t3 - t2), ("accept", t5 - t4)):
                times[name].append(value)
            logits.normal_()
        medians = {name: float(np.median(v)) * 1e3 for name, v in times.items()}
        rows.append({"batch": batch, **medians, "total": sum(medians.values()),
                     "fill_p90": float(np.percentile(times["fill"], 90)) * 1e3})
    return rows


def format_rows(rows: list[dict], vocab_note: str) -> str:
    lines = [f"grammar step cost ({vocab_note}); ms per step (median), and total us per row",
             f"{'B':>5} {'fill':>8} {'fill p90':>9} {'wire':>8} {'apply':>8} {'accept':>8} {'total':>8} "
             f"{'us/row':>8}"]
    for r in rows:
        lines.append(f"{r['batch']:>5} {r['fill']:>8.3f} {r['fill_p90']:>9.3f} {r['wire']:>8.3f} "
                     f"{r['apply']:>8.3f} {r['accept']:>8.3f} {r['total']:>8.3f} "
                     f"{r['total'] * 1e3 / r['batch']:>8.1f}")
    return "\n".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--tokenizer", required=True, help="Local tokenizer directory (e.g. ../shared/models/tokenizers/qwen3).")
@click.option("--vocab-size", type=int, default=None, help="The model's vocabulary (default: the tokenizer's).")
@click.option("--schema", "schema_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A JSON schema file (default: any JSON object).")
@click.option("--batch-sizes", default="1,4,16,64,256", show_default=True)
@click.option("--steps", default=30, show_default=True, type=int)
@click.option("--warm-steps", default=40, show_default=True, type=int,
              help="Each row first walks a random 0..N tokens, so rows stand at mixed positions.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--threads", default=1, show_default=True, type=int, help="torch threads for the apply.")
def cli(tokenizer: str, vocab_size: int | None, schema_file: str | None, batch_sizes: str, steps: int,
        warm_steps: int, seed: int, threads: int) -> None:
    """Per-step cost of structured outputs (fill, wire, apply, accept) against the batch size."""
    import torch

    torch.set_num_threads(threads)
    schema = None
    if schema_file:
        with open(schema_file) as f:
            schema = json.dumps(json.load(f))
    batches = [int(b) for b in batch_sizes.split(",") if b.strip()]
    rows = run(tokenizer, vocab_size, schema, batches, steps, warm_steps, seed)
    note = f"{tokenizer}, {'schema ' + schema_file if schema_file else 'any JSON object'}, apply on CPU"
    click.echo(format_rows(rows, note))
