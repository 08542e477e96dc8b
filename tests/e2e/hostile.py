"""Helpers of the hostile-client suites: raw sockets for what httpx will not send (slow bodies, odd Host
headers, bytes that are not UTF-8), and what the server leaves behind (processes, /dev/shm, its log)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import httpx

from tests.e2e.server import ServerProcess, descendants

KEY_A, KEY_B = "hostile-key-a", "hostile-key-b"
AUTH = {"Authorization": f"Bearer {KEY_A}"}
JSON = {"content-type": "application/json"}


def address(server: ServerProcess) -> tuple[str, int]:
    url = urlparse(server.url)
    return url.hostname, url.port


def raw_exchange(server: ServerProcess, request: bytes, timeout: float = 30.0) -> bytes:
    """Send `request` as it is and read until the server closes (or `timeout`)."""
    with socket.create_connection(address(server), timeout=timeout) as sock:
        sock.sendall(request)
        return read_until_closed(sock, timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def status_of(response: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(match.group(1)) if match else 0


def http_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                 host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@contextlib.contextmanager
def throttled(pid: int, run_s: float = 0.01, stop_s: float = 0.09):
    """Let process `pid` run `run_s` of every `run_s + stop_s` seconds (SIGSTOP/SIGCONT): the demo model writes
    2,000 tokens in a second or two on a fast machine, ten times that here, so a test that needs several
    streams running at once gets them whatever the machine's speed. The process is left stopped."""
    done = threading.Event()

    def pulse() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)
            os.kill(pid, signal.SIGSTOP)
            done.wait(stop_s)

    thread = threading.Thread(target=pulse, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def wait_for(condition, timeout: float = 30.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes(server: ServerProcess, module: str) -> list[int]:
    """The server's descendants running `python -m module`."""
    return [pid for pid in descendants(server.proc.pid) if f"-m {module} " in cmdline(pid)]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def shared_memory_maps(pid: int) -> list[tuple[str, int | None]]:
    """(the maps line, mode bits of the mapped segment or None where /proc does not show it) for each
    /dev/shm mapping of `pid`."""
    found = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/dev/shm/" not in line:
                continue
            span = line.split()[0]
            try:
                mode = os.stat(f"/proc/{pid}/map_files/{span}").st_mode & 0o777
            except OSError:
                mode = None
            found.append((line.strip(), mode))
    return found


def client(server: ServerProcess, key: str = KEY_A, timeout: float = 60.0) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
