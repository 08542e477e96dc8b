"""Frontend streaming throughput through the real HTTP path, over a FakeEngine in the server process.

    python -m tests.frontend.bench_streaming [--streams 64] [--tokens 256] [--step-delay 0] [--rounds 3]

Starts `launch_server` over a FakeEngine as a subprocess (the tiny byte-level model, so one token is one
character), then opens N concurrent streaming completions from a lean raw-socket asyncio client and
prints streamed tokens/s, time to first token, and the server process's CPU time per token. The fake
engine runs inside the server process (a real engine runs in its own processes), so the server's figures
include it: they are an upper bound on the frontend's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import REPO
from tests.frontend.harness import write_tiny_model


async def stream_once(host: str, port: int, tokens: int) -> tuple[float, float, int]:
    """One streaming request; returns (time to first text chunk, total time, completion tokens)."""
    body = json.dumps({"prompt": "bench", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    began = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    first = None
    received = bytearray()
    while chunk := await reader.read(1 << 16):
        if first is None and b'"text"' in chunk:
            first = time.perf_counter() - began
        received += chunk
    writer.close()
    total = time.perf_counter() - began
    usage = re.findall(rb'"completion_tokens":(\d+)', bytes(received))
    if not received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and b"data: [DONE]" not in received[-64:]:
        raise RuntimeError(f"stream did not end with [DONE]: {bytes(received[-200:])!r}")
    return first or total, total, int(usage[-1]) if usage else 0


async def run_round(host: str, port: int, streams: int, tokens: int) -> tuple[float, list[float], int]:
    began = time.perf_counter()
    results = await asyncio.gather(*(stream_once(host, port, tokens) for _ in range(streams)))
    elapsed = time.perf_counter() - began
    return elapsed, [r[0] for r in results], sum(r[2] for r in results)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per fake engine step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--coalesce", action="store_true",
                        help="the fake engine merges steps a lagging stream has not taken yet")
    args = parser.parse_args()

    model_dir = write_tiny_model(Path(tempfile.mkdtemp(prefix="ringserve-bench-")))
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.frontend.fake_server_main", str(model_dir), "--step-delay",
         str(args.step_delay), *(["--coalesce"] if args.coalesce else [])], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in server.stderr:
            match = re.search(r"serving tiny on http://([\d.]+):(\d+)", line)
            if match:
                host, port = match.group(1), int(match.group(2))
                url = True
                break
        if url is None:
            raise SystemExit("the benchmark server did not start")
        print(f"streams={args.streams} tokens/stream={args.tokens} step_delay={args.step_delay}s "
              f"coalesce={args.coalesce} "
              f"cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
        asyncio.run(run_round(host, port, 4, 8))              # warm-up
        for round_index in range(args.rounds):
            cpu_before = cpu_seconds(server.pid)
            elapsed, ttfts, tokens = asyncio.run(run_round(host, port, args.streams, args.tokens))
            cpu = cpu_seconds(server.pid) - cpu_before
            print(f"round {round_index}: {tokens / elapsed:9.0f} streamed tokens/s  "
                  f"ttft p50 {1e3 * statistics.median(ttfts):7.1f} ms  "
                  f"server cpu {1e6 * cpu / tokens:6.1f} us/token  ({tokens} tokens in {elapsed:.2f} s)")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


if __name__ == "__main__":
    main()
