"""Embedding serving, ringserve beside llama.cpp's `llama-server --embedding`, side by side in one run, on the same
model and machine, with the same client.

1. The model: ringserve serves MODEL (all-minilm-l6-v2 by default: a sentence-transformers directory);
   llama.cpp serves the same weights converted to GGUF with the peer's own `convert_hf_to_gguf.py` (float32,
   and float16 unless --no-f16), into --work-dir unless --gguf names files (../shared/peers/llama-cpp.sh builds
   the peer).
2. The load: `ringserve bench serve --endpoint /v1/embeddings` (tools/bench_serve.py): --num-prompts single
   sentences (the `sentences` dataset), --concurrency clients at once, after an unmeasured warm-up; the
   figures are requests/s and the latency of a whole request (E2EL).
3. Each engine in turn starts, serves every round's run, and stops; --rounds N alternates the engines N times
   (the cores may be shared: the load average before and after each turn is reported) and the table shows
   medians and ranges. The vectors of the first sentences from each server are compared (lowest cosine to
   ringserve's) as a check that both computed the same embedding.

    flock /tmp/ringserve-bench.lock python -m tools.compare_embed_serving --rounds 3
"""

from __future__ import annotations

import asyncio
import glob
import os
import platform
import shlex
import statistics
import subprocess
import sys

import click
import httpx
import numpy as np

from tools.compare_llamacpp import DEFAULT_PEER, start_llama_server
from tools.compare_vllm import emit_report, free_port, stop_server, wait_healthy

TARGET = 1.0            # the issue's: ringserve's requests/s >= llama.cpp's (float32 against F32)
CHECK_SENTENCES = 16    # sentences whose vectors are compared across the servers
FIGURES = ("request_throughput", "median_e2el_ms", "p99_e2el_ms")


def machine() -> str:
    """lscpu's model name and the vector extensions that decide these kernels' speed."""
    try:
        fields = dict(line.split(":", 1) for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines() if ":" in line)
    except (OSError, subprocess.CalledProcessError):
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    flags = set(fields.get("Flags", "").split())
    wanted = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
    return f"{fields.get('Model name', '?').strip()}, {os.cpu_count()} CPUs, {' '.join(wanted)}"


def convert(model_dir: str, name: str, peer_dir: str, work_dir: str, outtype: str) -> str:
    """The model as a GGUF of `outtype` (f32, f16), made once by the peer's convert_hf_to_gguf.py."""
    out = os.path.join(work_dir, f"{name}-{outtype}.gguf")
    if os.path.isfile(out):
        return out
    scripts = glob.glob(os.path.join(peer_dir, "src", "*", "vendor", "llama.cpp", "convert_hf_to_gguf.py"))
    if not scripts:
        raise click.UsageError(f"no convert_hf_to_gguf.py under {peer_dir}/src (../shared/peers/llama-cpp.sh)")
    os.makedirs(work_dir, exist_ok=True)
    done = subprocess.run([sys.executable, scripts[0], model_dir, "--outtype", outtype, "--outfile", out],
                          capture_output=True, text=True)
    if done.returncode:
        raise click.ClickException(f"{scripts[0]} failed:\n{done.stderr[-2000:]}")
    return out


def start_ringserve(model: str, port: int, threads: int, dtype: str, flags: tuple[str, ...] = (),
                    env: dict | None = None) -> subprocess.Popen:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = [sys.executable, "-m", "frontend.cli", "serve", model, "--port", str(port), "--host", "127.0.0.1",
            "--cpu-threads", str(threads), "--dtype", dtype, "--log-level", "warning", *flags]
    env = dict(os.environ, **(env or {}), PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def bench(port: int, name: str, tokenizer: str, num_prompts: int, concurrency: int) -> dict:
    """One measured run of single-sentence embedding requests at `concurrency`."""
    from tools.bench_serve import BenchSettings, run_benchmark

    settings = BenchSettings(base_url=f"http://127.0.0.1:{port}", model=name, tokenizer=tokenizer,
                             endpoint="embeddings", num_prompts=num_prompts, max_concurrency=concurrency,
                             num_warmups=2 * concurrency, disable_tqdm=True, metric_percentiles=[50.0, 99.0])
    result = asyncio.run(run_benchmark(settings))
    if result.failed:
        raise RuntimeError(f"{result.failed} requests failed: {next(e for e in result.errors if e)}")
    stats = result.stats["e2el"]
    return {"request_throughput": result.request_throughput, "median_e2el_ms": stats.median,
            "p99_e2el_ms": dict(stats.percentiles)[99.0], "input_tokens": result.total_input_tokens}


def vectors(port: int, name: str, sentences: list[str]) -> np.ndarray:
    body = {"model": name, "input": sentences, "encoding_format": "float"}
    response = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json=body, timeout=120)
    response.raise_for_status()
    data = sorted(response.json()["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float64)


def serve_turn(start, port: int, name: str, tokenizer: str, sentences: list[str], num_prompts: int,
               concurrency: int) -> dict:
    """Start a server, take its vectors of the check sentences and one measured run, stop it."""
    load_before = os.getloadavg()[0]
    proc = start(port)
    try:
        wait_healthy(proc, port)
        check = vectors(port, name, sentences)
        figures = bench(port, name, tokenizer, num_prompts, concurrency)
    finally:
        stop_server(proc)
    return {**figures, "vectors": check, "load": (load_before, os.getloadavg()[0])}


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def format_report(report: dict) -> str:
    rounds, engines = report["rounds"], report["engines"]
    lines = [f"{report['num_prompts']} single-sentence /v1/embeddings requests ({report['input_tokens']} tokens), "
             f"{report['concurrency']} at a time, {report['threads']} threads per server; {report['model']}",
             f"machine: {report['machine']}; {rounds} round(s), median [range]", ""]

    def cell(s: dict, fmt: str) -> str:
        text = format(s["median"], fmt)
        return text if rounds == 1 else f"{text} [{format(s['min'], fmt)}-{format(s['max'], fmt)}]"

    lines.append(f"{'engine':44}{'requests/s':>22}{'median E2EL ms':>24}{'p99 E2EL ms':>24}{'cosine':>9}")
    for name, figures in engines.items():
        lines.append(f"{name:44}{cell(figures['request_throughput'], '.1f'):>22}"
                     f"{cell(figures['median_e2el_ms'], '.1f'):>24}{cell(figures['p99_e2el_ms'], '.1f'):>24}"
                     f"{figures['min_cosine']:>9.5f}")
    ours = engines[report["ours"]]["request_throughput"]["median"]
    lines.append("")
    for name in engines:
        if name != report["ours"]:
            ratio = ours / engines[name]["request_throughput"]["median"]
            lines.append(f"requests/s, {report['ours']} / {name}: {ratio:.2f}x")
    ratio = ours / engines[report["peer"]]["request_throughput"]["median"]
    lines.append(f"target: {report['ours']} >= {TARGET:g}x {report['peer']}: {'met' if ratio >= TARGET else 'MISSED'} "
                 f"({ratio:.2f}x)")
    loads = ", ".join(f"{name} {a:.1f}->{b:.1f}" for name, runs in report["load"].items() for a, b in runs)
    lines.append(f"load average (1 min) before->after each turn: {loads}")
    return "\n".join(lines)


@click.command()
@click.option("--model", default="all-minilm-l6-v2", show_default=True,
              help="What ringserve serves: an embedding model directory (or a .zip of one), or all-minilm-l6-v2")
@click.option("--gguf", "ggufs", multiple=True, help="llama.cpp's files of the same weights (repeat); default: "
              "converted from MODEL with the peer's convert_hf_to_gguf.py into --work-dir")
@click.option("--no-f16", is_flag=True, help="convert to F32 only (with no --gguf)")
@click.option("--peer-dir", default=DEFAULT_PEER, show_default=True, help="llama.cpp's build (bin/, src/)")
@click.option("--work-dir", default="/tmp/ringserve-embed-peer", show_default=True, help="where converted files go")
@click.option("--pooling", default="mean", show_default=True, help="llama-server's --pooling (the model's own)")
@click.option("--variant", "our_variants", multiple=True, default=("",),
              help="more `ringserve serve` flags and NAME=VALUE environment for its rows (as --peer-variant)")
@click.option("--peer-variant", "variants", multiple=True, default=("",),
              help="more llama-server flags and NAME=VALUE environment for its rows, e.g. '--poll 0' or "
                   "'OMP_WAIT_POLICY=PASSIVE' (repeat for several variants; '': none)")
@click.option("--threads", default=min(os.cpu_count() or 1, 2), show_default=True,
              help="llama.cpp's -t and ringserve's --cpu-threads")
@click.option("--concurrency", default=16, show_default=True, help="clients at once (llama-server gets as many slots)")
@click.option("--num-prompts", default=1000, show_default=True)
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              help="ringserve's --dtype (repeat for several rows; the first is compared with the first GGUF)")
@click.option("--rounds", default=1, show_default=True, help="alternate the engines this many times")
@click.option("--out", default=None, help="write the whole report as JSON here")
def cli(model, ggufs, no_f16, peer_dir, work_dir, pooling, our_variants, variants, threads, concurrency, num_prompts,
        dtypes, rounds, out):
    """Embedding requests/s, ringserve beside llama-server --embedding on the same weights, one run."""
    from engine.config import EngineConfig
    from engine.client.tokenizer import load_tokenizer
    from tools.bench_datasets import make_sentences

    if not os.path.isfile(os.path.join(peer_dir, "bin", "llama-server")):
        raise click.UsageError(f"no llama-server in {peer_dir}/bin (build it: ../shared/peers/llama-cpp.sh)")
    config = EngineConfig(model=model).finalize()
    model_dir, name = config.model, config.model_name
    if not ggufs:
        ggufs = tuple(convert(model_dir, name, peer_dir, work_dir, t) for t in (("f32",) if no_f16 else ("f32", "f16")))
    max_len = config.max_model_len
    sentences = make_sentences(load_tokenizer(config), CHECK_SENTENCES, seed=1)
    starts = {}
    for dtype, variant in ((d, v) for v in our_variants for d in dtypes):
        flags, env = _variant(variant)
        starts[f"ringserve {dtype}" + (f" {variant}" if variant else "")] = \
            lambda port, d=dtype, f=flags, e=env: start_ringserve(model, port, threads, d, tuple(f), e)
    for path, variant in ((p, v) for v in variants for p in ggufs):
        label = f"llama.cpp {os.path.basename(path)}" + (f" {variant}" if variant else "")
        flags, env = _variant(variant)
        starts[label] = lambda port, p=path, f=flags, e=env: start_llama_server(
            peer_dir, p, port, threads, concurrency, concurrency * max_len,
            extra=("--embedding", "--pooling", pooling, "--alias", name, *f), env=e)
    runs: dict[str, list[dict]] = {label: [] for label in starts}
    for r in range(rounds):
        for label, start in starts.items():
            click.echo(f"round {r + 1}: {label}", err=True)
            runs[label].append(serve_turn(start, free_port(), name, model_dir, sentences, num_prompts, concurrency))
    ours = f"ringserve {dtypes[0]}" + (f" {our_variants[0]}" if our_variants[0] else "")
    peer = f"llama.cpp {os.path.basename(ggufs[0])}" + (f" {variants[0]}" if variants[0] else "")
    reference = runs[ours][0]["vectors"]
    report = {"model": f"{name} ({model_dir})", "ggufs": list(ggufs), "threads": threads, "concurrency": concurrency,
              "num_prompts": num_prompts, "rounds": rounds, "machine": machine(), "ours": ours, "peer": peer,
              "input_tokens": runs[ours][0]["input_tokens"],
              "engines": {label: {**{key: _summary([run[key] for run in turns]) for key in FIGURES},
                                  "min_cosine": _min_cosine(turns[0]["vectors"], reference)}
                          for label, turns in runs.items()},
              "load": {label: [run["load"] for run in turns] for label, turns in runs.items()}}
    emit_report(report, format_report(report), out)


def _variant(text: str) -> tuple[list[str], dict[str, str]]:
    """'--poll 0 OMP_WAIT_POLICY=PASSIVE' -> the flags and the environment it gives llama-server."""
    words = shlex.split(text)
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    return [w for w in words if "=" not in w or w.startswith("-")], env


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


if __name__ == "__main__":
    sys.exit(cli())
