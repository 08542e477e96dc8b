"""ringserve vs. vLLM, side by side, in one run, on the same model, workload and machine.

1. Materialises the model once: config.json + generation_config.json + tokenizer + random bf16 weights
   (safetensors, fixed seed), so both engines load byte-identical weights.
2. Offline: the nano-vllm workload (scaled by flags) through ringserve's `LLM` and through vLLM's `LLM`
   (run by the peer's own interpreter: tools/peer_vllm_offline.py).
3. Serving: starts vLLM's OpenAI server from --vllm-python, then ringserve's, each alone on the machine,
   with flags that mean the same (max_model_len, block size, KV cache bytes, prefix caching, batch limits),
   and runs the same `bench serve` scenarios against each with the same client.
4. Prints one table with both engines and the ratios; --out writes everything as JSON.

    python -m tools.compare_vllm --vllm-python /tmp/peer-vllm/bin/python [MODEL_CONFIG_DIR]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import click
import httpx

from tools.bench_offline import generation_config_defaults, make_workload, run_ringserve

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "shared", "models")
DEFAULT_MODEL = os.path.join(SHARED, "configs", "qwen3-tiny")
DEFAULT_TOKENIZER = os.path.join(SHARED, "tokenizers", "qwen3")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja")


@dataclass(frozen=True)
class Scenario:
    name: str
    dataset: str
    input_len: int
    output_len: int
    num_prompts: int
    max_concurrency: int
    prefix_len: int = 0
    lower_is_better: tuple[str, ...] = ()       # the figures the target compares


SCENARIOS = (
    Scenario("random 256/128, concurrency 1", "random", 256, 128, 16, 1,
             lower_is_better=("median_ttft_ms", "median_tpot_ms")),
    Scenario("random 256/128, concurrency 16", "random", 256, 128, 64, 16),
    Scenario("prefix 1024+64/128, concurrency 4", "prefix", 64, 128, 24, 4, prefix_len=1024,
             lower_is_better=("median_ttft_ms",)),
)
HEADLINE = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms",
            "completed", "failed")


def materialize(model: str, tokenizer: str, dtype: str, seed: int) -> str:
    """A model directory with random weights that both engines load (built once, cached)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.models.demo import cache_root

    name = f"compare-{os.path.basename(os.path.normpath(model))}-{dtype}-seed{seed}"
    target = os.path.join(cache_root(), name)
    if os.path.isfile(os.path.join(target, "model.safetensors")):
        return target
    staging = tempfile.mkdtemp(prefix=".compare-", dir=cache_root())
    config = AutoConfig.from_pretrained(model)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    hf.save_pretrained(staging)
    shutil.copy(os.path.join(model, "generation_config.json"), staging)
    for f in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(tokenizer, f)):
            shutil.copy(os.path.join(tokenizer, f), staging)
    os.rename(staging, target)
    return target


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(python: str, model: str, port: int, flags: dict) -> subprocess.Popen:
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
            "--host", "127.0.0.1", "--dtype", flags["dtype"], "--max-model-len", str(flags["max_model_len"]),
            "--block-size", str(flags["block_size"]), "--kv-cache-memory-bytes", str(flags["kv_cache_memory"]),
            "--max-num-seqs", str(flags["max_num_seqs"]),
            "--max-num-batched-tokens", str(flags["max_num_batched_tokens"]),
            "--enable-prefix-caching", "--seed", "0", "--uvicorn-log-level", "warning"]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(os.devnull, "w"))


def start_ringserve(model: str, port: int, flags: dict) -> subprocess.Popen:
    args = [sys.executable, "-m", "frontend.cli", "serve", model, "--port", str(port), "--host", "127.0.0.1",
            "--dtype", flags["dtype"], "--max-model-len", str(flags["max_model_len"]),
            "--block-size", str(flags["block_size"]), "--kv-cache-memory", str(flags["kv_cache_memory"]),
            "--max-num-seqs", str(flags["max_num_seqs"]),
            "--max-num-batched-tokens", str(flags["max_num_batched_tokens"]),
            "--enable-prefix-caching", "--seed", "0", "--log-level", "warning"]
    if flags.get("cpu_threads"):
        args += ["--cpu-threads", str(flags["cpu_threads"])]
    if flags.get("quantization"):
        args += ["--quantization", flags["quantization"]]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not become healthy in time")


def run_scenarios(port: int, tokenizer: str, scenarios: tuple[Scenario, ...] = SCENARIOS) -> dict[str, dict]:
    from tools.bench_serve import BenchSettings, run_benchmark

    results = {}
    for sc in scenarios:
        settings = BenchSettings(
            base_url=f"http://127.0.0.1:{port}", tokenizer=tokenizer, dataset=sc.dataset,
            num_prompts=sc.num_prompts, random_input_len=sc.input_len, random_output_len=sc.output_len,
            prefix_len=sc.prefix_len, max_concurrency=sc.max_concurrency, ignore_eos=True, seed=0,
            metric_percentiles=[50.0, 99.0], num_warmups=2, disable_tqdm=True)
        results[sc.name] = asyncio.run(run_benchmark(settings)).to_dict()
    return results


def serve_with(name: str, start, port: int, tokenizer: str) -> dict[str, dict]:
    proc = start()
    try:
        wait_healthy(proc, port)
        click.echo(f"{name}: serving, running {len(SCENARIOS)} scenarios", err=True)
        return run_scenarios(port, tokenizer)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def emit_report(report: dict, text: str, out: str | None) -> None:
    """Print the table; with out, also write the whole report (and the table) as JSON."""
    click.echo(text)
    if out:
        with open(out, "w") as f:
            json.dump({**report, "table": text}, f, indent=1)


def format_report(report: dict) -> str:
    lines = [f"model: {report['model']} ({report['flags']['dtype']}); machine: {report['machine']}"]
    if "offline" in report:
        ours, peer = report["offline"]["ringserve"], report["offline"]["vllm"]
        lines += ["", "offline (nano-vllm workload: " + report["offline"]["workload"] + ")",
                  f"{'':34}{'ringserve':>12}{'vLLM':>12}{'ratio':>9}",
                  f"{'output tokens/s':34}{ours['output_tokens_per_s']:>12.1f}{peer['output_tokens_per_s']:>12.1f}"
                  f"{ours['output_tokens_per_s'] / peer['output_tokens_per_s']:>8.2f}x"]
    if "serve" in report:
        for sc in SCENARIOS:
            ours, peer = report["serve"]["ringserve"][sc.name], report["serve"]["vllm"][sc.name]
            lines += ["", f"serving: {sc.name} ({sc.num_prompts} prompts)",
                      f"{'':34}{'ringserve':>12}{'vLLM':>12}{'ratio':>9}"]
            for key in HEADLINE:
                a, b = ours.get(key), peer.get(key)
                ratio = f"{a / b:>8.2f}x" if isinstance(a, float) and b else ""
                mark = " *" if key in sc.lower_is_better else ""
                lines.append(f"{key + mark:34}{a:>12.2f}{b:>12.2f}{ratio}" if isinstance(a, float)
                             else f"{key + mark:34}{a!s:>12}{b!s:>12}")
        lines.append("\n* the figure the target compares (lower is better); ratio = ringserve / vLLM")
    return "\n".join(lines)


@click.command()
@click.argument("model", default=DEFAULT_MODEL)
@click.option("--vllm-python", required=True, help="the peer's interpreter (see ../shared/peers/vllm-cpu.sh)")
@click.option("--tokenizer", default=DEFAULT_TOKENIZER, show_default=True)
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--max-model-len", default=2048, show_default=True)
@click.option("--block-size", default=32, show_default=True, help="vLLM's CPU attention needs a multiple of 32")
@click.option("--kv-cache-memory", default=2 << 30, show_default=True, help="bytes, both engines")
@click.option("--max-num-seqs", default=256, show_default=True)
@click.option("--max-num-batched-tokens", default=4096, show_default=True)
@click.option("--num-seqs", default=64, show_default=True, help="offline workload size")
@click.option("--offline/--no-offline", default=True)
@click.option("--serve/--no-serve", default=True)
@click.option("--out", default=None, help="write the whole report as JSON here")
def cli(model, vllm_python, tokenizer, dtype, max_model_len, block_size, kv_cache_memory, max_num_seqs,
        max_num_batched_tokens, num_seqs, offline, serve, out):
    """Offline throughput and serving latency, ringserve beside vLLM, one run."""
    import platform

    model = os.path.abspath(model)
    tokenizer = os.path.abspath(tokenizer)
    flags = dict(dtype=dtype, max_model_len=max_model_len, block_size=block_size,
                 kv_cache_memory=kv_cache_memory, max_num_seqs=max_num_seqs,
                 max_num_batched_tokens=max_num_batched_tokens)
    model_dir = materialize(model, tokenizer, dtype, seed=0)
    report = {"model": model, "materialized": model_dir, "flags": flags,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"}
    if offline:
        defaults = generation_config_defaults(model_dir)
        vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
        workload = make_workload(num_seqs, (100, 512), (100, 256), vocab, 0.6, 0,
                                 defaults.get("top_k", 0), defaults.get("top_p", 1.0))
        click.echo("offline: ringserve", err=True)
        ours = run_ringserve(workload, model_dir, None, dtype=dtype, max_model_len=max_model_len,
                             block_size=block_size, kv_cache_memory=kv_cache_memory, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, seed=0)
        click.echo("offline: vLLM", err=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(workload.to_json())
        engine_args = dict(dtype=dtype, max_model_len=max_model_len, block_size=block_size,
                           kv_cache_memory_bytes=kv_cache_memory, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=True, seed=0)
        proc = subprocess.run([vllm_python, os.path.join(HERE, "peer_vllm_offline.py"), f.name, model_dir,
                               json.dumps(engine_args)], capture_output=True, text=True)
        os.unlink(f.name)
        if proc.returncode:
            raise click.ClickException("vLLM's offline run failed:\n" + proc.stderr[-3000:])
        line = next(x for x in proc.stdout.splitlines() if x.startswith("PEER-RESULT "))
        peer = json.loads(line[len("PEER-RESULT "):])
        report["offline"] = {"workload": f"{num_seqs} sequences, prompts 100-512, outputs 100-256, "
                                         f"temperature 0.6, top_k {workload.top_k}, top_p {workload.top_p}",
                             "ringserve": ours, "vllm": peer}
    if serve:
        port = free_port()
        report["serve"] = {
            "vllm": serve_with("vLLM", lambda: start_vllm(vllm_python, model_dir, port, flags), port, tokenizer),
            "ringserve": serve_with("ringserve", lambda: start_ringserve(model_dir, port, flags), port,
                                    tokenizer),
        }
    emit_report(report, format_report(report), out)


if __name__ == "__main__":
    sys.exit(cli())
