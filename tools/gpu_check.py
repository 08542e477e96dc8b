"""The first thing to run on a GPU machine: every GPU-only check of the project, one JSON report and a
readable summary, inside about 10 minutes on an H100.

    python -m tools.gpu_check [--out gpu_check.json] [--budget-s 600] [--with-interpreter]

Steps, in order of what they tell (each is a subprocess with its own time limit, so a crash or a hang in one
is reported and the rest still run; a step that no longer fits in the budget is reported as skipped):
  gpu-tests         pytest -m gpu: kernels at real shapes, graphs == eager == transformers, graph-size walk
                    on tiny models, chunked prefill, prefix hits, sampling on the GPU
  serve-demo        `ringserve serve` on the built-in demo model (head_dim 16): start, two requests, SIGTERM
  serve-qwen3-0.6b  the same on dummy-weight Qwen3-0.6B (../shared/models/configs, the qwen3 tokenizer)
  graph-walk        every captured CUDA-graph size against eager, token for token (tools.gpu_graph_walk)
  latency-*         `bench latency` with and without graphs, % of peak HBM bandwidth: qwen3-0.6b, llama-3.1-8b
  throughput        `bench throughput` on the nano-vllm workload (Qwen3-0.6B, 256 sequences, no transformers)
  kernels           python -m tools.bench_kernels (Llama-3-8B shapes)
  interpreter       (--with-interpreter) the interpreter kernel tests with CUDA hidden: the default suite's
                    CPU semantics on this host
On a machine without CUDA it prints "no CUDA GPU" and exits 0 without running anything.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
# ../shared beside the checkout, or where RINGSERVE_SHARED says (as in tests/conftest.py): a device machine gets
# only the checkout, so a copy travels inside it
SHARED = Path(os.environ.get("RINGSERVE_SHARED", REPO.parent / "shared"))
CONFIGS = SHARED / "models" / "configs"
TOKENIZERS = SHARED / "models" / "tokenizers"
PY = sys.executable


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout_s: int
    output: str = "json"            # json: the last stdout line is the result | pytest | text
    env: dict[str, str] = field(default_factory=dict)
    needs: tuple[Path, ...] = ()


def gpu_test_files() -> list[str]:
    """The test modules that hold `gpu` tests: collecting only these keeps the step independent of the HTTP
    clients and schema tools that the rest of the suite imports (a GPU host may lack them)."""
    marked = re.compile(r"pytest\.mark\.gpu|pytestmark\s*=.*\bgpu\b")
    return sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")
                  if marked.search(path.read_text()))


def steps(with_interpreter: bool) -> list[Step]:
    qwen06, llama8 = CONFIGS / "qwen3-0.6b", CONFIGS / "llama-3.1-8b"
    qwen_tok = TOKENIZERS / "qwen3"
    listed = [
        # a per-test limit, so one hang fails its test instead of the whole step
        Step("gpu-tests", [PY, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--timeout", "120", "-m", "gpu",
                           *gpu_test_files()], 300, "pytest"),
        Step("serve-demo", [PY, "-m", "tools.serve_smoke", "--max-model-len", "1024"], 120),
        Step("serve-qwen3-0.6b", [PY, "-m", "tools.serve_smoke", str(qwen06), "--load-format", "dummy",
                                  "--tokenizer", str(qwen_tok), "--max-model-len", "4096"], 150,
             needs=(qwen06, qwen_tok)),
        Step("graph-walk", [PY, "-m", "tools.gpu_graph_walk", "--model", str(qwen06), "--json"], 150,
             needs=(qwen06,)),
        Step("latency-qwen3-0.6b", [PY, "-m", "tools.bench_latency", "--model", str(qwen06), "--iters", "2",
                                    "--json"], 120, needs=(qwen06,)),
        Step("latency-llama-3.1-8b", [PY, "-m", "tools.bench_latency", "--model", str(llama8), "--iters", "2",
                                      "--output-len", "64", "--json"], 180, needs=(llama8,)),
        Step("throughput", [PY, "-m", "tools.bench_offline", "--model", str(qwen06), "--tokenizer", str(qwen_tok),
                            "--num-seqs", "256", "--input-len", "100", "1024", "--output-len", "100", "1024",
                            "--max-model-len", "2048", "--no-hf", "--json"], 150, needs=(qwen06, qwen_tok)),
        Step("kernels", [PY, "-m", "tools.bench_kernels"], 90, "text"),
    ]
    if with_interpreter:
        listed.append(Step("interpreter", [PY, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "interpreter",
                                           "tests/kernels"], 600, "pytest", env={"CUDA_VISIBLE_DEVICES": ""}))
    return listed


PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors|deselected)")


def parse_output(step: Step, stdout: str) -> object:
    if step.output == "json":
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    if step.output == "pytest":
        counts = {}
        for number, kind in PYTEST_COUNTS.findall(stdout.splitlines()[-1] if stdout.strip() else ""):
            counts[kind.rstrip("s") if kind == "errors" else kind] = int(number)
        failed = [line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        return {"counts": counts, "failed": failed}
    return stdout


def run_step(step: Step, remaining_s: float) -> dict:
    missing = [str(p) for p in step.needs if not p.exists()]
    if missing:
        return {"name": step.name, "status": "skipped", "reason": f"missing {', '.join(missing)}"}
    if remaining_s < step.timeout_s / 3:
        return {"name": step.name, "status": "skipped", "reason": f"{remaining_s:.0f} s of the budget left"}
    start = time.monotonic()
    # its own session, so a timeout ends the whole tree (a server and its engine processes included)
    proc = subprocess.Popen(step.argv, cwd=REPO, env={**os.environ, **step.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=min(step.timeout_s, remaining_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return {"name": step.name, "status": "timeout", "seconds": round(time.monotonic() - start, 1),
                "output_tail": (stdout + stderr)[-3000:]}
    report = {"name": step.name, "seconds": round(time.monotonic() - start, 1), "exit_code": proc.returncode}
    try:
        report["result"] = parse_output(step, stdout)
    except ValueError as error:
        report["result"] = None
        report["parse_error"] = str(error)
    report["status"] = "ok" if proc.returncode == 0 else "failed"
    if proc.returncode != 0 or report["result"] is None:
        report["output_tail"] = (stdout + stderr)[-3000:]
    return report


def environment() -> dict:
    import torch
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi.stdout.strip(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "gpus": torch.cuda.device_count()}


def summary(report: dict) -> str:
    """The report as a few readable lines: each step's status and its headline figures."""
    env = report.get("environment", {})
    lines = [f"gpu_check on {env.get('gpu', '?')} (torch {env.get('torch', '?')}, triton {env.get('triton', '?')}), "
             f"{report.get('seconds', 0):.0f} s"]
    for step in report["steps"]:
        head = f"{step['name']:<22} {step['status']:<8}"
        result = step.get("result")
        detail = step.get("reason", "")
        if step["name"].endswith("tests") or step["name"] == "interpreter":
            if result:
                detail = ", ".join(f"{n} {k}" for k, n in result["counts"].items())
                detail += "".join(f"\n{'':31}FAILED {f}" for f in result["failed"][:10])
        elif step["name"].startswith("serve") and result:
            detail = (f"startup {result.get('startup_s')} s, tokens {result.get('completion_tokens')}, "
                      f"shutdown {result.get('shutdown_s')} s {result.get('error', '')}")
        elif step["name"] == "graph-walk" and result:
            detail = (f"sizes {len(result['sizes_walked'])}/{len(result['captured_sizes'])}, "
                      f"{result['tokens_compared']} tokens, {len(result['divergences'])} divergent requests")
        elif step["name"].startswith("latency") and result:
            detail = "; ".join(f"{r['mode']}: {r['decode_step_ms']:.2f} ms/step"
                               + ("" if r.get("peak_fraction") is None else f" ({100 * r['peak_fraction']:.0f}% of peak)")
                               for r in result["results"])
        elif step["name"] == "throughput" and result:
            detail = "; ".join(f"{r['engine']}: {r['output_tokens_per_s']:.0f} output tok/s" for r in result["results"])
        elif step["name"] == "kernels" and isinstance(result, str):
            detail = f"{len(result.splitlines())} lines (see the report)"
        if step["status"] in ("failed", "timeout") and not detail:
            detail = (step.get("output_tail") or "").strip().splitlines()[-1:][0:1]
            detail = detail[0] if detail else ""
        lines.append(f"{head} {detail}".rstrip())
    return "\n".join(lines)


@click.command()
@click.option("--out", default="gpu_check.json", show_default=True, help="the JSON report (the summary goes "
              "beside it, .txt)")
@click.option("--budget-s", default=600, show_default=True, help="total time; steps that no longer fit are skipped")
@click.option("--with-interpreter", is_flag=True, help="also run the interpreter kernel tests with CUDA hidden")
def cli(out, budget_s, with_interpreter):
    """Run every GPU-only check; write one JSON report and print a summary."""
    import torch

    if not torch.cuda.is_available():
        click.echo("no CUDA GPU: tools.gpu_check runs only on a machine with one; nothing was run")
        return
    start = time.monotonic()
    report = {"environment": environment(), "steps": []}
    for step in steps(with_interpreter):
        remaining = budget_s - (time.monotonic() - start)
        result = run_step(step, remaining)
        report["steps"].append(result)
        click.echo(f"{result['name']}: {result['status']} ({result.get('seconds', 0)} s)", err=True)
    report["seconds"] = round(time.monotonic() - start, 1)
    text = summary(report)
    Path(out).write_text(json.dumps(report, indent=1))
    Path(out).with_suffix(".txt").write_text(text + "\n")
    click.echo(text)
    if any(s["status"] in ("failed", "timeout") for s in report["steps"]):
        sys.exit(1)


if __name__ == "__main__":
    cli()
