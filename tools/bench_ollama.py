"""What Ollama's /api/chat adds over /v1/chat/completions, per request, measured side by side in one run.

Starts `ringserve serve ringserve-demo --load-format fake` (the whole engine, a model that costs nothing), then
sends the same chat (same prompt, greedy, the same number of tokens) to both routes one request at a time,
alternating the routes in blocks so that drift on a shared machine falls on both alike, streamed and whole.
Reports each route's median and mean request latency, the frontend process's CPU time per request (from
/proc: what the route itself costs, steadier than latency on a loaded machine) and the differences (the
target: at most 1 ms per request).

    python -m tools.bench_ollama [--requests 200] [--tokens 32] [--json]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

import click

from tools.bench_frontend import cpu_seconds, fake_server, post

BLOCK = 25          # requests of one route in a row (the frontend's CPU time is read around each block)


async def one_request(host: str, port: int, route: bytes, payload: bytes) -> tuple[float, bytes]:
    """(seconds from connecting to the last byte, the response body)."""
    start = time.perf_counter()
    body = await post(host, port, route, payload)
    return time.perf_counter() - start, body


def tokens_of(route: bytes, body: bytes, stream: bool) -> int:
    """The output tokens the response reports (a check that both routes did the same work)."""
    if route == b"/api/chat":
        return json.loads(body.strip().split(b"\n")[-1])["eval_count"]
    if stream:
        return next(json.loads(e[6:]) for e in reversed(body.split(b"\n\n")) if e.startswith(b"data: {"))[
            "usage"]["completion_tokens"]
    return json.loads(body)["usage"]["completion_tokens"]


def payloads(model: str, tokens: int, stream: bool) -> dict[bytes, bytes]:
    messages = [{"role": "user", "content": "benchmark"}]
    openai = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": stream,
              "ignore_eos": True}
    if stream:
        openai["stream_options"] = {"include_usage": True}
    ollama = {"model": model, "messages": messages, "stream": stream,
              "options": {"num_predict": tokens, "temperature": 0}}
    return {b"/v1/chat/completions": json.dumps(openai).encode(), b"/api/chat": json.dumps(ollama).encode()}


async def compare(pid: int, host: str, port: int, model: str, requests: int, tokens: int, stream: bool) -> dict:
    bodies = payloads(model, tokens, stream)
    times: dict[bytes, list[float]] = {route: [] for route in bodies}
    cpu: dict[bytes, float] = dict.fromkeys(bodies, 0.0)
    counts: dict[bytes, set[int]] = {route: set() for route in bodies}
    for block in range(-(-requests // BLOCK)):
        for route in list(bodies) if block % 2 == 0 else list(reversed(bodies)):
            before = cpu_seconds(pid)
            for _ in range(min(BLOCK, requests - block * BLOCK)):
                seconds, body = await one_request(host, port, route, bodies[route])
                times[route].append(seconds)
                counts[route].add(tokens_of(route, body, stream))
            cpu[route] += cpu_seconds(pid) - before
    row = {"stream": stream, "tokens": sorted(counts[b"/api/chat"] | counts[b"/v1/chat/completions"])}
    for route, name in ((b"/v1/chat/completions", "openai"), (b"/api/chat", "ollama")):
        row[f"{name}_median_ms"] = statistics.median(times[route]) * 1e3
        row[f"{name}_mean_ms"] = statistics.fmean(times[route]) * 1e3
        row[f"{name}_cpu_ms"] = cpu[route] / len(times[route]) * 1e3
    row["added_cpu_ms"] = row["ollama_cpu_ms"] - row["openai_cpu_ms"]
    row["added_median_ms"] = row["ollama_median_ms"] - row["openai_median_ms"]
    row["added_mean_ms"] = row["ollama_mean_ms"] - row["openai_mean_ms"]
    return row


@click.command("ollama")
@click.option("--requests", default=200, show_default=True, help="requests per route and mode")
@click.option("--tokens", default=32, show_default=True, help="output tokens of each request")
@click.option("--json", "as_json", is_flag=True)
def cli(requests: int, tokens: int, as_json: bool) -> None:
    """Per-request latency of /api/chat against /v1/chat/completions (fake model, one request at a time)."""
    with fake_server([]) as (proc, host, port, model):
        asyncio.run(compare(proc.pid, host, port, model, 2 * BLOCK, tokens, True))        # warm-up
        rows = [asyncio.run(compare(proc.pid, host, port, model, requests, tokens, stream))
                for stream in (True, False)]
    if as_json:
        click.echo(json.dumps(rows))
        return
    click.echo(f"{'mode':>7} {'tokens':>7} {'/v1 median ms':>14} {'/api median ms':>15} {'added median':>13} "
               f"{'added mean':>11} {'/v1 CPU ms':>11} {'/api CPU ms':>12} {'added CPU':>10}")
    for r in rows:
        click.echo(f"{'stream' if r['stream'] else 'whole':>7} {','.join(map(str, r['tokens'])):>7} "
                   f"{r['openai_median_ms']:>14.2f} {r['ollama_median_ms']:>15.2f} {r['added_median_ms']:>13.2f} "
                   f"{r['added_mean_ms']:>11.2f} {r['openai_cpu_ms']:>11.2f} {r['ollama_cpu_ms']:>12.2f} "
                   f"{r['added_cpu_ms']:>10.2f}")


if __name__ == "__main__":
    sys.exit(cli())
