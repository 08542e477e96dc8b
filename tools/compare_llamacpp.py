"""ringserve vs. llama.cpp's llama-server on the CPU, side by side, in one run, on the same model and machine.

1. Serving: starts llama-server from the peer directory (../shared/peers/llama-cpp.sh builds it) on the
   GGUF, runs the `bench serve` scenarios of tools/compare_vllm (random 256/128 at concurrency 1 and 16, a
   shared 1,024-token prefix at concurrency 4) with the same client, stops it; then the same for ringserve
   on MODEL (the same .gguf file, or an HF directory holding the same weights).
2. Batch-1 decode shaped like `llama-bench -p 0 -n 128` (tokens/s of 128 generated tokens): llama-bench
   itself, and `ringserve bench latency`'s measurement at batch 1.
3. Prints one table with both engines, the ratios and the issue-18 targets, with the machine's load
   average before and after each engine's turn (the cores may be shared); --rounds N alternates the
   engines N times and reports the median and the range of each figure.

    python -m tools.compare_llamacpp /tmp/peer-llama-cpp/smollm2-f16.gguf    # both engines on one file
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

import click

from tools.compare_vllm import SCENARIOS, emit_report, free_port, run_scenarios, start_ringserve, wait_healthy

DEFAULT_PEER = "/tmp/peer-llama-cpp"
SERVE_FIGURES = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms")
# (scenario index, figure, how ringserve must compare to llama.cpp): the targets
TARGETS = ((0, "median_tpot_ms", "<=", 1.0), (1, "output_throughput", ">=", 1.5), (2, "median_ttft_ms", "<=", 1.0))


def start_llama_server(peer: str, gguf: str, port: int, threads: int, slots: int, context: int,
                       ) -> subprocess.Popen:
    binary = os.path.join(peer, "bin", "llama-server")
    args = [binary, "-m", gguf, "-t", str(threads), "-np", str(slots), "-c", str(context), "--port", str(port),
            "--host", "127.0.0.1", "--alias", "model"]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(peer, "bin"))
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def serve_figures(start, port: int, tokenizer: str, scenarios: tuple) -> dict:
    """Start a server, run every scenario, stop it; the load average around the run is kept with it."""
    load_before = os.getloadavg()[0]
    proc = start()
    try:
        wait_healthy(proc, port)
        results = run_scenarios(port, tokenizer, scenarios)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"scenarios": results, "load": (load_before, os.getloadavg()[0])}


def llama_bench_decode(peer: str, gguf: str, threads: int, tokens: int, repetitions: int) -> float:
    """llama-bench's tg<tokens> figure: tokens/s generating from an empty context at batch 1."""
    args = [os.path.join(peer, "bin", "llama-bench"), "-m", gguf, "-t", str(threads), "-p", "0", "-n",
            str(tokens), "-r", str(repetitions), "-o", "json"]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(peer, "bin"))
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout
    return float(json.loads(out)[0]["avg_ts"])


def ringserve_decode(model: str, dtype: str, threads: int, tokens: int, repetitions: int,
                     quantization: str | None = None) -> float:
    """The same shape through ringserve: one request, a one-token prompt, `tokens` generated."""
    from tools.bench_latency import measure

    result = measure(model, None, 1, 1, tokens, repetitions, load_format="auto", dtype=dtype, cpu_threads=threads,
                     quantization=quantization)
    return result["output_tokens_per_s"]


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def format_report(report: dict) -> str:
    rounds = report["rounds"]
    lines = [f"model: {report['model']} (ringserve {report['dtype']}, quantization "
             f"{report.get('quantization') or 'default'}) vs llama.cpp {report['gguf']}; "
             f"{report['threads']} threads; machine: {report['machine']}; {rounds} round(s), median [range]"]

    def cell(s: dict) -> str:
        text = f"{s['median']:.1f}"
        return text if rounds == 1 else f"{text} [{s['min']:.1f}-{s['max']:.1f}]"

    width = 26 if rounds > 1 else 12
    header = f"{'':30}{'llama.cpp':>{width}}{'ringserve':>{width}}{'ratio':>9}"
    for i, name in enumerate(report["scenarios"] if "serve" in report else ()):
        lines += ["", f"serving: {name}", header]
        for key in SERVE_FIGURES:
            peer, ours = report["serve"]["llama.cpp"][i][key], report["serve"]["ringserve"][i][key]
            lines.append(f"{key:30}{cell(peer):>{width}}{cell(ours):>{width}}"
                         f"{ours['median'] / peer['median']:>8.2f}x")
    if "decode" in report:
        peer, ours = report["decode"]["llama.cpp"], report["decode"]["ringserve"]
        lines += ["", f"batch-1 decode, {report['decode']['tokens']} tokens (llama-bench tg shape)", header,
                  f"{'tokens/s':30}{cell(peer):>{width}}{cell(ours):>{width}}{ours['median'] / peer['median']:>8.2f}x"]
    if "serve" not in report:
        return "\n".join(lines)
    lines += ["", "targets (ratio = ringserve / llama.cpp, medians):"]
    for i, key, op, bound in TARGETS:
        ratio = report["serve"]["ringserve"][i][key]["median"] / report["serve"]["llama.cpp"][i][key]["median"]
        met = ratio <= bound if op == "<=" else ratio >= bound
        lines.append(f"  {SCENARIOS[i].name}: {key} ratio {ratio:.2f} {op} {bound}: {'met' if met else 'MISSED'}")
    loads = ", ".join(f"{name} {a:.1f}->{b:.1f}" for name, runs in report["load"].items() for a, b in runs)
    lines.append(f"load average (1 min) before->after each turn: {loads}")
    return "\n".join(lines)


@click.command()
@click.argument("model", type=click.Path(exists=True))
@click.option("--gguf", default=None, help="the model file llama.cpp serves (the same weights as MODEL); "
              "default: MODEL when it is a .gguf file")
@click.option("--peer-dir", default=DEFAULT_PEER, show_default=True, help="llama.cpp's build (bin/)")
@click.option("--tokenizer", default=None, help="for the client; default: MODEL (a directory or a GGUF file)")
@click.option("--dtype", default="auto", show_default=True,
              help="ringserve's dtype (auto: the file's own, float16 for an F16 GGUF)")
@click.option("--quantization", type=click.Choice(["gguf", "none"]), default=None,
              help="ringserve's --quantization (default: gguf for a file with quantized tensors: kept in blocks)")
@click.option("--threads", default=os.cpu_count() or 1, show_default=True,
              help="llama.cpp's -t and ringserve's --cpu-threads")
@click.option("--slots", default=16, show_default=True, help="llama-server's parallel slots (-np)")
@click.option("--context", default=20480, show_default=True,
              help="llama-server's total context (-c), split over the slots: 1,280 tokens each by default")
@click.option("--kv-cache-memory", default=1 << 30, show_default=True, help="ringserve's KV cache bytes")
@click.option("--decode-tokens", default=128, show_default=True)
@click.option("--rounds", default=1, show_default=True, help="alternate the engines this many times")
@click.option("--prompts-scale", default=1.0, show_default=True,
              help="scale every scenario's number of prompts (e.g. 0.25 for a quick look; concurrency stays)")
@click.option("--serve/--no-serve", default=True)
@click.option("--decode/--no-decode", default=True)
@click.option("--out", default=None, help="write the whole report as JSON here")
def cli(model, gguf, peer_dir, tokenizer, dtype, quantization, threads, slots, context, kv_cache_memory, decode_tokens, rounds,
        prompts_scale, serve, decode, out):
    """Serving latency/throughput and batch-1 decode, ringserve beside llama.cpp, one run."""
    import platform

    model = os.path.abspath(model)
    if gguf is None:
        if not model.lower().endswith(".gguf"):
            raise click.UsageError("--gguf is needed when MODEL is not a GGUF file (llama.cpp serves only GGUF)")
        gguf = model
    tokenizer = os.path.abspath(tokenizer or model)
    if not (os.path.isdir(tokenizer) or tokenizer.lower().endswith(".gguf")):
        raise click.UsageError("--tokenizer must be a directory with the model's tokenizer, or a GGUF file")
    if not os.path.isfile(os.path.join(peer_dir, "bin", "llama-server")):
        raise click.UsageError(f"no llama-server in {peer_dir}/bin (build it: ../shared/peers/llama-cpp.sh)")
    flags = dict(dtype=dtype, max_model_len=2048, block_size=16, kv_cache_memory=kv_cache_memory,
                 max_num_seqs=slots, max_num_batched_tokens=2048, cpu_threads=threads, quantization=quantization)
    report: dict = {"model": model, "gguf": gguf, "dtype": dtype, "quantization": quantization, "threads": threads,
                    "rounds": rounds,
                    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                    "load": {"llama.cpp": [], "ringserve": []}}
    scenarios = tuple(dataclasses.replace(sc, num_prompts=max(sc.max_concurrency, round(sc.num_prompts * prompts_scale)))
                      for sc in SCENARIOS)
    report["scenarios"] = [f"{sc.name} ({sc.num_prompts} prompts)" for sc in scenarios]
    runs: dict[str, list[dict]] = {"llama.cpp": [], "ringserve": []}
    speeds: dict[str, list[float]] = {"llama.cpp": [], "ringserve": []}
    for r in range(rounds):
        if serve:
            port = free_port()
            click.echo(f"round {r + 1}: llama.cpp serving", err=True)
            peer = serve_figures(lambda p=port: start_llama_server(peer_dir, gguf, p, threads, slots, context), port,
                                 tokenizer, scenarios)
            click.echo(f"round {r + 1}: ringserve serving", err=True)
            ours = serve_figures(lambda p=port: start_ringserve(model, p, flags), port, tokenizer, scenarios)
            for name, result in (("llama.cpp", peer), ("ringserve", ours)):
                runs[name].append(result["scenarios"])
                report["load"][name].append(result["load"])
        if decode:
            click.echo(f"round {r + 1}: batch-1 decode", err=True)
            speeds["llama.cpp"].append(llama_bench_decode(peer_dir, gguf, threads, decode_tokens, 3))
            speeds["ringserve"].append(ringserve_decode(model, dtype, threads, decode_tokens, 3, quantization))
    if serve:
        report["serve"] = {
            name: [{key: _summary([run[sc.name][key] for run in runs[name]]) for key in SERVE_FIGURES}
                   for sc in SCENARIOS]
            for name in runs
        }
    if decode:
        report["decode"] = {"tokens": decode_tokens, **{name: _summary(v) for name, v in speeds.items()}}
    emit_report(report, format_report(report), out)


if __name__ == "__main__":
    sys.exit(cli())
