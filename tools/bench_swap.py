"""Model swaps on a server with several models (`serve --models-dir DIR --models-max 1`), timed by the client.

One request at a time, streamed, each timed to its first token:
- cold: a model nobody has loaded (every model is unloaded first): the load and the first token;
- warm: the same model again (the baseline);
- swap: alternating between two models under --models-max 1, so each request unloads the other model and
  loads its own; "swap adds" is the median swap's first token minus the median warm one;
- after sleep level 1 and 2: a request to a sleeping model (it wakes first); and the wake alone
  (POST /wake_up), beside the cold load it spares.

    ringserve bench swap --models-dir DIR [--models A,B] [--serve-arg=--models-parked --serve-arg=1]
                                                              # starts `ringserve serve` on a free port
    ringserve bench swap --base-url URL --models A,B          # a server that runs with --models-max 1
    python -m tools.bench_swap ...
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from contextlib import contextmanager

import click
import httpx

from tools.bench_client import build_payload, send_request
from tools.serve_smoke import ServeProcess


def first_token(url: str, model: str, max_tokens: int, timeout: float = 300.0) -> float:
    """Seconds from sending one streamed chat request to its first token."""
    async def run():
        async with httpx.AsyncClient(timeout=timeout, headers={"Content-Type": "application/json"}) as client:
            payload = build_payload("chat", model, "Say hello.", max_tokens, ignore_eos=True)
            return await send_request(client, url + "/v1/chat/completions", payload, 0, "chat", timeout)

    record = asyncio.run(run())
    if not record.success:
        raise RuntimeError(f"a request to {model} failed: {record.error}")
    return record.ttft


def post(url: str, path: str, timeout: float = 300.0, **kwargs) -> float:
    """Seconds one POST took; raises on an error status."""
    start = time.perf_counter()
    response = httpx.post(url + path, timeout=timeout, **kwargs)
    response.raise_for_status()
    return time.perf_counter() - start


def unload_all(url: str) -> None:
    for model in httpx.get(url + "/v1/models", timeout=30).json()["data"]:
        if model.get("status", {}).get("value") not in (None, "unloaded"):
            post(url, "/models/unload", json={"model": model["id"]})


def run_scenario(url: str, a: str, b: str, rounds: int, max_tokens: int) -> dict:
    unload_all(url)
    results: dict[str, list[float]] = {"cold": [first_token(url, a, max_tokens)]}
    results["warm"] = [first_token(url, a, max_tokens) for _ in range(3)]
    results["swap"] = [first_token(url, name, max_tokens) for _ in range(rounds) for name in (b, a)]
    for level in (1, 2):
        post(url, "/sleep", params={"level": level, "model": a})
        results[f"wake_up (level {level})"] = [post(url, "/wake_up", params={"model": a})]
        post(url, "/sleep", params={"level": level, "model": a})
        results[f"after sleep level {level}"] = [first_token(url, a, max_tokens)]
    summary = {name: {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                      "max_s": round(max(times), 3), "n": len(times)} for name, times in results.items()}
    summary["swap_adds_s"] = round(summary["swap"]["median_s"] - summary["warm"]["median_s"], 3)
    return summary


@contextmanager
def served(models_dir: str, serve_args: list[str], startup_timeout: float = 300.0):
    """`ringserve serve --models-dir DIR --models-max 1` on a free loopback port: (url, model names)."""
    server = ServeProcess(["--models-dir", models_dir, "--models-max", "1", *serve_args])
    try:
        if not server.wait_ready(startup_timeout):
            raise click.ClickException("the server did not start:\n" + "".join(server.lines[-20:]))
        yield server.url, server.model.split(",")
    finally:
        server.stop()


@click.command("swap")
@click.option("--models-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Start `ringserve serve --models-dir DIR --models-max 1` and measure it.")
@click.option("--base-url", default=None, help="Measure a running server instead (started with --models-max 1).")
@click.option("--models", default=None, help="The two models to swap between, A,B (default: the first two).")
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True, help="Swaps each way.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--serve-arg", "serve_args", multiple=True, help="A further `ringserve serve` argument (repeat).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def cli(models_dir: str | None, base_url: str | None, models: str | None, rounds: int, max_tokens: int,
        serve_args: tuple[str, ...], as_json: bool) -> None:
    """First-token times of cold loads, swaps and wakes on a server with several models."""
    if (models_dir is None) == (base_url is None):
        raise click.UsageError("give one of --models-dir (a server is started) and --base-url")

    def measure(url: str, names: list[str]) -> dict:
        chosen = models.split(",") if models else names[:2]
        if len(chosen) != 2:
            raise click.UsageError(f"two models are needed to swap between; got {chosen}")
        return {"models": chosen, **run_scenario(url, chosen[0], chosen[1], rounds, max_tokens)}

    if base_url is not None:
        names = [m["id"] for m in httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30).json()["data"]]
        result = measure(base_url.rstrip("/"), names)
    else:
        with served(models_dir, list(serve_args)) as (url, names):
            result = measure(url, names)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"models {result['models'][0]} and {result['models'][1]}, one request at a time, "
               f"max_tokens {max_tokens}")
    click.echo(f"{'first token of':<24}{'median s':>10}{'min s':>10}{'max s':>10}{'n':>5}")
    for name, row in result.items():
        if isinstance(row, dict):
            click.echo(f"{name:<24}{row['median_s']:>10.3f}{row['min_s']:>10.3f}{row['max_s']:>10.3f}{row['n']:>5}")
    click.echo(f"a swap adds {result['swap_adds_s']:.3f} s to the first token (median swap - median warm)")


if __name__ == "__main__":
    cli()
