"""A newcomer's first minutes, timed: clone the repo, run the README's first command in a fresh virtual
environment, and time the install, the first /health and the first answer; then the executor's memory.

    flock /tmp/ringserve-bench.lock python -m tools.fresh_install [--ref REF] [--workdir DIR]

The install is the README's first shell command up to `ringserve serve` (whatever it says at REF), run as
written in a new venv with pip's cache off (as on a fresh machine); the server then starts with an empty
XDG cache (so the CPU kernels are built as on a first start). The first answer is the README's question at
temperature 0 and again with the server's default sampling, then one JSON-object request (xgrammar works).
The executor's resident memory (VmRSS) is read
once the server is healthy and again after REQUESTS more chat requests. Prints one JSON object.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import click

from engine.process import descendants

QUESTION = "What is the capital of France?"
REQUESTS = 16
SERVE = "ringserve serve"


def readme_install_command(readme: str) -> str:
    """The README's first shell command that ends by starting the server, without that last step."""
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", readme, flags=re.S):
        for line in block.splitlines():
            if line.rstrip().endswith(f"&& {SERVE}"):
                return line.rstrip()[: -len(f"&& {SERVE}")].strip()
    raise click.ClickException("the README shows no `... && ringserve serve` command")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _executor_rss(server_pid: int) -> int:
    total = 0
    for pid in descendants(server_pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"engine.executor.main" in f.read():
                total += _rss_bytes(pid)
    return total


def _chat(url: str, body: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
               if not os.path.islink(os.path.join(root, name)))


@click.command()
@click.option("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), show_default=True,
              help="The git repository to clone.")
@click.option("--ref", default="HEAD", show_default=True, help="The commit to check out.")
@click.option("--workdir", default=None, help="Where to clone and make the venv (default: a new temp dir).")
@click.option("--port", default=8765, show_default=True, type=int)
@click.option("--keep", is_flag=True, help="Keep the clone and the venv.")
def main(repo: str, ref: str, workdir: str | None, port: int, keep: bool) -> None:
    workdir = workdir or tempfile.mkdtemp(prefix="ringserve-fresh-")
    clone, venv, cache = (os.path.join(workdir, name) for name in ("ringserve", "venv", "xdg-cache"))
    subprocess.run(["git", "clone", "--quiet", repo, clone], check=True)
    subprocess.run(["git", "-C", clone, "checkout", "--quiet", ref], check=True)
    with open(os.path.join(clone, "README.md")) as f:
        install = readme_install_command(f.read())
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"],
               PIP_NO_CACHE_DIR="1", XDG_CACHE_HOME=cache)
    env.pop("PYTHONPATH", None)
    result: dict = {"ref": subprocess.run(["git", "-C", clone, "rev-parse", "--short", "HEAD"], check=True,
                                          capture_output=True, text=True).stdout.strip(), "install_command": install}
    start = time.monotonic()
    subprocess.run(["bash", "-c", install], cwd=clone, env=env, check=True, stdout=subprocess.DEVNULL)
    result["install_s"] = round(time.monotonic() - start, 1)
    result["venv_bytes"] = _directory_bytes(venv)
    for package in ("triton", "xgrammar"):
        result[f"{package}_installed"] = bool(glob.glob(os.path.join(venv, "lib", "python*", "site-packages",
                                                                     package)))

    log_path = os.path.join(workdir, "serve.log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        server = subprocess.Popen(["ringserve", "serve", "--port", str(port)], cwd=clone, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise click.ClickException(f"the server exited; see {log_path}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        result["first_health_s"] = round(time.monotonic() - start, 1)
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        messages = [{"role": "user", "content": QUESTION}]
        for label, extra in (("greedy", {"temperature": 0}), ("defaults", {})):
            asked = time.monotonic()
            reply = _chat(url, {"model": model, "messages": messages, **extra})
            result[f"answer_{label}_s"] = round(time.monotonic() - asked, 2)
            result[f"answer_{label}_since_start_s"] = round(time.monotonic() - start, 1)
            result[f"answer_{label}"] = reply["choices"][0]["message"]["content"][:300]
            result[f"answer_{label}_tokens"] = reply["usage"]["completion_tokens"]
        try:
            structured = _chat(url, {"model": model, "messages": messages, "max_tokens": 32,
                                     "response_format": {"type": "json_object"}})
            result["structured_output"] = structured["choices"][0]["message"]["content"][:200]
        except urllib.error.HTTPError as e:
            result["structured_output"] = f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}"
        result["executor_rss_after_start_bytes"] = _executor_rss(server.pid)
        for i in range(REQUESTS):
            _chat(url, {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": f"Count to {i}"}]})
        result[f"executor_rss_after_{REQUESTS}_requests_bytes"] = _executor_rss(server.pid)
        with open(log_path) as f:
            result["startup_lines"] = [line.rstrip() for line in f.read().replace("\r", "\n").splitlines()
                                       if line.strip() and "%|" not in line][:30]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    click.echo(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
