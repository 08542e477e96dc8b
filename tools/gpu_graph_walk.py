"""CUDA-graph size walk: every captured batch size replayed and compared with eager mode, token for token.

max_num_seqs requests (the largest captured size) are prefilled together; request i stops after 2 + i
tokens, so the decode batch shrinks by one request a step, from max_num_seqs to 1, and every captured size
(1, 2, 4, 8, 16, 32, ...) is replayed with live rows and padding rows alike. The same prompts then run with
--enforce-eager; greedy outputs must agree token for token. A divergence is reported with the batch size
(and the captured size it was padded to) at that step: graphs and eager may split the decode attention
differently, so a bf16 near-tie can legitimately flip, which the report lets one tell from a broken size.

    python -m tools.gpu_graph_walk --model ../shared/models/configs/qwen3-0.6b [--json]   (CUDA only)
"""

from __future__ import annotations

import json
import os
import random
import sys

import click


def walk_max_tokens(num_requests: int) -> list[int]:
    """max_tokens per request: request i generates 2 + i tokens, so after the prefill step, decode step j
    (j = 1, 2, ...) runs the num_requests - j + 1 requests still going."""
    return [2 + i for i in range(num_requests)]


def batch_size_at(max_tokens: list[int], token_index: int) -> int:
    """Live requests when token token_index (0 = from the prefill step) of every request is produced."""
    return sum(m > token_index for m in max_tokens)


def padded_size(batch: int, sizes: list[int]) -> int | None:
    return next((s for s in sizes if s >= batch), None)


def run_walk(model: str, max_num_seqs: int, prompt_len: int, dtype: str, load_format: str) -> dict:
    from engine import LLM, SamplingParams
    from engine.config import read_model_config
    from engine.executor.cuda_graphs import capture_sizes

    vocab = int(read_model_config(model)["vocab_size"])
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(min(vocab, 10_000)) for _ in range(prompt_len)]}
               for _ in range(max_num_seqs)]
    max_tokens = walk_max_tokens(max_num_seqs)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    engine_args = dict(skip_tokenizer_init=True, dtype=dtype, load_format=load_format, max_num_seqs=max_num_seqs,
                       max_model_len=prompt_len + max(max_tokens) + 16,
                       max_num_batched_tokens=max(8192, max_num_seqs * prompt_len), enable_prefix_caching=False)
    runs = {}
    for mode, eager in (("graphs", False), ("eager", True)):
        with LLM(model, enforce_eager=eager, **engine_args) as llm:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            runs[mode] = [list(o.outputs[0].token_ids) for o in outputs]
    sizes = capture_sizes(max_num_seqs)
    divergences = []
    for req, (g, e) in enumerate(zip(runs["graphs"], runs["eager"], strict=True)):
        if g != e:
            index = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
            batch = batch_size_at(max_tokens, index)
            divergences.append({"request": req, "token_index": index, "batch_size": batch,
                                "captured_size": None if index == 0 else padded_size(batch, sizes)})
    walked = sorted({padded_size(batch_size_at(max_tokens, j), sizes) for j in range(1, max(max_tokens))})
    return {"model": model, "captured_sizes": sizes, "sizes_walked": walked, "requests": max_num_seqs,
            "tokens_compared": sum(len(t) for t in runs["graphs"]), "divergences": divergences,
            "ok": not divergences and walked == sizes}


@click.command()
@click.option("--model", required=True, help="HF model directory (config.json; weights unless dummy)")
@click.option("--max-num-seqs", default=256, show_default=True, help="the largest captured size")
@click.option("--prompt-len", default=16, show_default=True)
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--load-format", default="dummy", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def cli(model, max_num_seqs, prompt_len, dtype, load_format, as_json):
    """Every captured CUDA-graph size against eager mode, token for token."""
    import torch

    if not torch.cuda.is_available():
        click.echo("gpu_graph_walk needs a CUDA GPU", err=True)
        sys.exit(2)
    result = run_walk(os.path.abspath(model), max_num_seqs, prompt_len, dtype, load_format)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"sizes walked {result['sizes_walked']} of {result['captured_sizes']}; "
               f"{result['tokens_compared']} tokens compared; {len(result['divergences'])} divergences")
    for d in result["divergences"][:20]:
        click.echo(f"  request {d['request']}: token {d['token_index']} at batch {d['batch_size']} "
                   f"(graph size {d['captured_size']})")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    cli()
