"""What keeping a GGUF file's weights quantized changes in the model's output: `--quantization gguf` (the
quantized kernels, 8-bit activations) beside `--quantization none` (dequantized at load) on the same file.

    python -m tools.compare_quantization [MODEL.gguf] [--text FILE] [--max-tokens 4096] [--dtype auto]

Over a long real text (default: this repository's README.md) both runs score every token with prompt
logprobs; the tool prints how often their top-1 tokens agree, the mean absolute difference of the text's
token logprobs and each run's perplexity. Then both answer the README's example questions greedily, side by
side. MODEL defaults to the bundled SmolLM2-135M-Instruct (Q4_1).
"""

from __future__ import annotations

import json
import math
import os
import sys

import click

def executor_rss(model: str, quantization: str, dtype: str) -> dict:
    """`ringserve serve MODEL --quantization Q`: the executor process's resident memory once it has answered
    one request, and the weight bytes its startup line reports."""
    import httpx

    from tools.compare_vllm import free_port, start_ringserve, wait_healthy

    port = free_port()
    flags = dict(dtype=dtype, max_model_len=2048, block_size=16, kv_cache_memory=256 << 20, max_num_seqs=16,
                 max_num_batched_tokens=2048, quantization=quantization)
    proc = start_ringserve(model, port, flags)
    try:
        wait_healthy(proc, port)
        base = f"http://127.0.0.1:{port}/v1"
        name = httpx.get(f"{base}/models", timeout=10).json()["data"][0]["id"]
        httpx.post(f"{base}/completions", timeout=120,
                   json={"model": name, "prompt": "The capital of France is", "max_tokens": 16}).raise_for_status()
        executors = [pid for pid in _descendants(proc.pid) if b"engine.executor.main" in _read(f"/proc/{pid}/cmdline")]
        rss = sum(_rss_bytes(pid) for pid in executors)
    finally:
        proc.terminate()
        proc.wait(60)
    return {"quantization": quantization, "executor_rss_mb": rss / 1e6}


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat:
                parents[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def _rss_bytes(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


QUESTIONS = ("What is the capital of France?", "How many days are in a week?", "What is 2 + 2?",
             "Write a haiku about the sea.")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def score(llm, chunks: list[list[int]]) -> list[tuple[int, float]]:
    """(top-1 token, logprob of the text's token) at every scored position of every chunk."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    out = []
    for request in llm.generate([{"prompt_token_ids": c} for c in chunks], params, use_tqdm=False):
        for token, position in zip(request.prompt_token_ids[1:], request.prompt_logprobs[1:], strict=True):
            top = max(position, key=position.get)
            out.append((top, position[token]))
    return out


def run(model: str, quantization: str, dtype: str, chunks: list[list[int]], max_len: int) -> dict:
    from engine import LLM, SamplingParams

    with LLM(model, quantization=quantization, dtype=dtype, max_model_len=max_len, kv_cache_memory=256 << 20,
             enable_prefix_caching=False) as llm:
        scored = score(llm, chunks)
        answers = [o.outputs[0].text for o in llm.chat([[{"role": "user", "content": q}] for q in QUESTIONS],
                                                        SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)]
    return {"scored": scored, "answers": answers}


@click.command()
@click.argument("model", default="smollm2-135m-instruct")
@click.option("--text", default=os.path.join(REPO, "README.md"), show_default=True, help="a long real text")
@click.option("--max-tokens", default=4096, show_default=True, help="tokens of the text to score")
@click.option("--chunk", default=1024, show_default=True, help="tokens per request")
@click.option("--dtype", default="auto", show_default=True)
@click.option("--rss/--no-rss", default=True, help="also serve the model each way and read the executor's RSS")
@click.option("--json", "as_json", is_flag=True)
def cli(model: str, text: str, max_tokens: int, chunk: int, dtype: str, rss: bool, as_json: bool) -> None:
    from engine.client.tokenizer import load_tokenizer
    from engine.config import EngineConfig

    config = EngineConfig(model=model, dtype=dtype).finalize()
    tokenizer = load_tokenizer(config)
    with open(text, encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())[:max_tokens]
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk) if len(ids[i:i + chunk]) > 1]
    runs = {q: run(model, q, dtype, chunks, chunk + 64) for q in ("gguf", "none")}
    quantized, dequantized = runs["gguf"]["scored"], runs["none"]["scored"]
    agree = sum(a[0] == b[0] for a, b in zip(quantized, dequantized, strict=True)) / len(quantized)
    delta = sum(abs(a[1] - b[1]) for a, b in zip(quantized, dequantized, strict=True)) / len(quantized)
    perplexity = {q: math.exp(-sum(lp for _, lp in runs[q]["scored"]) / len(quantized)) for q in runs}
    report = {"model": config.model, "dtype": config.resolved_dtype, "text": text, "positions": len(quantized),
              "top1_agreement": agree, "mean_abs_logprob_delta": delta, "perplexity": perplexity,
              "answers": {q: dict(zip(QUESTIONS, runs[q]["answers"], strict=True)) for q in runs}}
    if rss:
        report["executor_rss_mb"] = {q: executor_rss(config.model, q, dtype)["executor_rss_mb"] for q in runs}
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"{report['model']} ({report['dtype']}), {len(quantized)} positions of {text}")
    click.echo(f"top-1 agreement, gguf vs none: {agree:.4f}; mean |logprob difference| {delta:.4f}; "
               f"perplexity gguf {perplexity['gguf']:.3f}, none {perplexity['none']:.3f}")
    if rss:
        sizes = report["executor_rss_mb"]
        click.echo(f"executor RSS serving it: gguf {sizes['gguf']:.0f} MB, none {sizes['none']:.0f} MB "
                   f"({sizes['none'] - sizes['gguf']:.0f} MB less)")
    for i, question in enumerate(QUESTIONS):
        click.echo(f"\n{question}\n  gguf: {runs['gguf']['answers'][i]!r}\n  none: {runs['none']['answers'][i]!r}")


if __name__ == "__main__":
    sys.exit(cli())
