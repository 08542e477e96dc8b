"""tools.gpu_check on a machine without a GPU (it says so and runs nothing), its report parsing and summary,
and the graph walk's plan: the decode batch passes through every captured CUDA-graph size."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from engine.executor.cuda_graphs import capture_sizes
from tests.conftest import REPO
from tools.gpu_check import Step, parse_output, run_step, steps, summary
from tools.gpu_graph_walk import batch_size_at, padded_size, walk_max_tokens


def test_without_cuda_it_says_so_and_runs_nothing(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}              # a CPU machine, even on a GPU host
    done = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU" in done.stdout
    assert not out.exists() and not out.with_suffix(".txt").exists()
    assert done.stderr.strip() == ""                              # no step announced itself


@pytest.mark.parametrize("max_num_seqs", [1, 5, 64, 256, 512])
def test_the_walk_replays_every_captured_size(max_num_seqs):
    sizes = capture_sizes(max_num_seqs)
    max_tokens = walk_max_tokens(max_num_seqs)
    batches = [batch_size_at(max_tokens, j) for j in range(1, max(max_tokens))]
    assert batches == list(range(max_num_seqs, 0, -1))            # one request leaves per decode step
    assert sorted({padded_size(b, sizes) for b in batches}) == sizes


def test_pytest_and_json_outputs_are_parsed():
    pytest_step = Step("gpu-tests", [], 1, "pytest")
    parsed = parse_output(pytest_step, "FAILED tests/x.py::test_a - boom\n2 failed, 7 passed, 1 skipped in 3.1s\n")
    assert parsed == {"counts": {"failed": 2, "passed": 7, "skipped": 1}, "failed": ["tests/x.py::test_a - boom"]}
    assert parse_output(Step("x", [], 1), 'log line\n{"ok": true}\n') == {"ok": True}
    assert parse_output(Step("x", [], 1), "crashed before printing\n") is None


def test_summary_names_every_step_and_its_figures():
    report = {"environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13", "triton": "3.9"}, "seconds": 512,
              "steps": [
                  {"name": "gpu-tests", "status": "failed",
                   "result": {"counts": {"failed": 1, "passed": 20}, "failed": ["tests/a.py::t"]}},
                  {"name": "graph-walk", "status": "ok", "result": {"sizes_walked": [1, 2], "captured_sizes": [1, 2],
                                                                    "tokens_compared": 5, "divergences": []}},
                  {"name": "latency-llama-3.1-8b", "status": "ok", "result": {"results": [
                      {"mode": "cuda graphs", "decode_step_ms": 6.4, "peak_fraction": 0.7},
                      {"mode": "eager", "decode_step_ms": 11.0, "peak_fraction": 0.41}]}},
                  {"name": "throughput", "status": "timeout", "output_tail": "step 3\nstill going"},
                  {"name": "kernels", "status": "skipped", "reason": "20 s of the budget left"},
              ]}
    text = summary(report)
    assert "NVIDIA H100" in text and "1 failed, 20 passed" in text and "FAILED tests/a.py::t" in text
    assert "cuda graphs: 6.40 ms/step (70% of peak)" in text and "eager: 11.00 ms/step (41% of peak)" in text
    assert "still going" in text and "20 s of the budget left" in text
    assert "sizes 2/2, 5 tokens, 0 divergent requests" in text


def test_every_step_names_an_existing_module():
    listed = steps(with_interpreter=True)
    for step in listed:
        module = step.argv[2]
        assert module == "pytest" or (REPO / (module.replace(".", "/") + ".py")).exists(), module


def test_a_step_past_its_time_limit_is_ended_with_its_children(tmp_path):
    # a step that starts a child (as serve_smoke starts a server) and hangs: both must be gone afterwards
    pid_file = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    result = run_step(Step("hang", [sys.executable, "-c", script], 2, "text"), remaining_s=2)
    assert result["status"] == "timeout" and "started" in result["output_tail"]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
