"""Serve smoke test: start `ringserve serve` on a free loopback port, wait for /health, send one completion
and one chat request, check their token counts, then stop the server with SIGTERM and time its exit.

    python -m tools.serve_smoke [MODEL --load-format dummy --tokenizer DIR] [other serve flags]

Without MODEL it serves the built-in demo model. Prints one JSON object; exit status 1 on any failure.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import click

SERVING = re.compile(r"serving (\S+) on (http://\S+)")
MAX_TOKENS = 8


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


class ServeProcess:
    """`ringserve serve ARGS` on a free loopback port: its log lines, and the model(s) and URL of its ready line."""

    def __init__(self, serve_args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "frontend.cli", "serve", *serve_args, "--host",
                                      "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.model = self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            match = SERVING.search(line)
            if match and not self.url:
                self.model, self.url = match.group(1), match.group(2)
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        """Whether the ready line came within `timeout` seconds."""
        return self._ready.wait(timeout) and bool(self.url)

    def stop(self, timeout: float = 60.0) -> bool:
        """SIGTERM, then SIGKILL after `timeout` seconds; whether it left in time."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False


def smoke(serve_args: list[str], startup_timeout: float = 300.0) -> dict:
    started = time.monotonic()
    server = ServeProcess(serve_args)
    result: dict = {"args": serve_args, "ok": False}
    try:
        if not server.wait_ready(startup_timeout):
            result["error"] = "the server did not start"
            return result
        url, model = server.url, server.model
        while time.monotonic() - started < startup_timeout:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        result["startup_s"] = round(time.monotonic() - started, 1)
        completion = _post(url + "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": MAX_TOKENS,
                                                      "temperature": 0, "ignore_eos": True}, 120)
        chat = _post(url + "/v1/chat/completions", {"model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True,
                                                    "temperature": 0.7, "top_p": 0.9,
                                                    "messages": [{"role": "user", "content": "hi"}]}, 120)
        result["completion_tokens"] = [completion["usage"]["completion_tokens"], chat["usage"]["completion_tokens"]]
        result["ok"] = result["completion_tokens"] == [MAX_TOKENS, MAX_TOKENS]
    except Exception as error:  # noqa: BLE001  the report names any failure
        result["error"] = f"{type(error).__name__}: {error}"
    finally:
        stop = time.monotonic()
        if not server.stop(60):
            result["ok"] = False
            result["error"] = result.get("error", "") + " (no exit 60 s after SIGTERM)"
        result["shutdown_s"] = round(time.monotonic() - stop, 1)
        result["exit_code"] = server.proc.returncode
        if not result["ok"]:
            result["log_tail"] = "".join(server.lines[-30:])
    return result


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def cli(serve_args):
    """Start `ringserve serve SERVE_ARGS`, send two requests, stop it; print one JSON object."""
    result = smoke(list(serve_args))
    click.echo(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    cli()
