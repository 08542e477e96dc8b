"""Streaming through the real HTTP path with a zero-cost model: what the frontend can deliver.

Starts `ringserve serve --load-format fake` (the whole engine, but a model that costs nothing), then
streams completions (or, with `--api chat`, chat completions) at 1, 16 and 64 concurrent streams and reports streamed tokens/s, requests/s and the
frontend process's CPU time per streamed token (from /proc). The client is a minimal asyncio HTTP/1.1
client that only collects bytes and reads the final usage event, so that on a 2-core machine the load
generator takes as little CPU as possible from the server it measures.

    python -m tools.bench_frontend [--api chat] [--json]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time

import click

SERVING = re.compile(r"serving (\S+) on http://([\d.]+):(\d+)")


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str, int, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", "ringserve-demo", "--load-format", "fake",
                             "--port", "0", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    for line in proc.stdout:
        match = SERVING.search(line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, match.group(2), int(match.group(3)), match.group(1)
    raise RuntimeError("the server did not start")


@contextlib.contextmanager
def fake_server(extra: list[str]):
    """(process, host, port, model) of a started fake-model server, terminated on leaving."""
    proc, host, port, model = start_server(extra)
    try:
        yield proc, host, port, model
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dechunk(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"chunked" not in head.lower():
        return body
    out, i = bytearray(), 0
    while True:
        end = body.index(b"\r\n", i)
        size = int(body[i:end], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        i = end + 4 + size


ROUTES = {"completions": b"/v1/completions", "chat": b"/v1/chat/completions"}


async def post(host: str, port: int, route: bytes, payload: bytes) -> bytes:
    """One POST over a fresh connection; returns the whole response body (dechunked)."""
    reader, writer = await asyncio.open_connection(host, port)
    # the server's own address as the Host: a loopback server refuses other names (DNS rebinding)
    writer.write(b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
                 % (route, host.encode(), port, len(payload), payload))
    chunks = []
    while data := await reader.read(1 << 16):
        chunks.append(data)
    writer.close()
    return dechunk(b"".join(chunks))


async def stream_one(host: str, port: int, route: bytes, payload: bytes) -> int:
    """One streamed request; returns the completion tokens the final usage event reports."""
    events = (await post(host, port, route, payload)).split(b"\n\n")
    usage = next(json.loads(e[6:]) for e in reversed(events) if e.startswith(b"data: {"))
    return usage["usage"]["completion_tokens"]


async def run_level(host: str, port: int, model: str, streams: int, requests: int, tokens: int,
                    api: str = "completions") -> tuple:
    body = {"model": model, "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "benchmark"}]
    else:
        body["prompt"] = "benchmark"
    payload, route = json.dumps(body).encode(), ROUTES[api]
    queue = list(range(requests))

    async def worker() -> int:
        got = 0
        while queue:
            queue.pop()
            got += await stream_one(host, port, route, payload)
        return got

    start = time.perf_counter()
    counts = await asyncio.gather(*(worker() for _ in range(streams)))
    return sum(counts), time.perf_counter() - start


@click.command("frontend")
@click.option("--levels", default="1,16,64", show_default=True, help="concurrent streams")
@click.option("--tokens", default=256, show_default=True, help="max_tokens of each request")
@click.option("--requests-per-stream", default=4, show_default=True)
@click.option("--api", type=click.Choice(list(ROUTES)), default="completions", show_default=True,
              help="what to stream: completions, or chat completions (chat template, chat chunks)")
@click.option("--json", "as_json", is_flag=True)
def cli(levels: str, tokens: int, requests_per_stream: int, api: str, as_json: bool) -> None:
    """Streamed tokens/s, requests/s and frontend CPU per token through the real HTTP path (fake model)."""
    rows = []
    with fake_server([]) as (proc, host, port, model):
        asyncio.run(run_level(host, port, model, 4, 8, 32, api))     # warm-up
        for streams in [int(x) for x in levels.split(",")]:
            cpu_before = cpu_seconds(proc.pid)
            total, seconds = asyncio.run(run_level(host, port, model, streams, streams * requests_per_stream,
                                                   tokens, api))
            cpu = cpu_seconds(proc.pid) - cpu_before
            rows.append({"streams": streams, "tokens": total, "seconds": seconds,
                         "tokens_per_s": total / seconds,
                         "requests_per_s": streams * requests_per_stream / seconds,
                         "frontend_cpu_us_per_token": cpu / total * 1e6})
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'streams':>8} {'tokens/s':>10} {'requests/s':>11} {'frontend CPU us/token':>22}")
    for r in rows:
        click.echo(f"{r['streams']:>8} {r['tokens_per_s']:>10.0f} {r['requests_per_s']:>11.1f} "
                   f"{r['frontend_cpu_us_per_token']:>22.1f}")


if __name__ == "__main__":
    sys.exit(cli())
