"""`ringserve bench ipc`: our shared-memory rings against pyzmq ipc and multiprocessing.Queue, side by side.

For each transport and message size (64 B, 4 KiB, 256 KiB by default) it measures the round-trip latency
(p50/p99: the parent sends, a spawned peer process echoes) and the one-way throughput (the parent sends N
messages as fast as the transport takes them; the peer acknowledges the last); with --repeat each figure is
the median of that many rounds. Transports:

  ring-spin       SpscRing pair, both sides spinning (--spin-us, default 1 ms: it covers a round trip)
  ring-sleep      SpscRing pair with spin_us=0: every wait goes through the semaphore (eventcount) path
  broadcast-2     BroadcastRing to 2 reader processes (spinning); reader 0 echoes on an SpscRing, reader 1
                  reads along
  zmq-ipc         pyzmq PUSH/PULL over ipc:// sockets (skipped when pyzmq is missing)
  mp-queue        multiprocessing.Queue (spawn); it pickles, which is why no ringserve channel uses it

The peer processes are started with subprocess (rings, zmq) or the spawn context (mp-queue), never fork.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import click

from shm.broadcast import BroadcastRing
from shm.ring import RingSpec, SpscRing
from shm.wait import pid_check, popen_check

SIZES = (64, 4096, 256 * 1024)
RING_BYTES = 8 << 20
TRANSPORTS = ("ring-spin", "ring-sleep", "broadcast-2", "zmq-ipc", "mp-queue")
QUIT = b"quit"


def _plan(size: int, scale: float) -> tuple[int, int]:
    """(round trips, one-way messages) for a message size: fewer for big messages, so each takes ~a second."""
    trips = 5000 if size <= 4096 else 500
    messages = {64: 200_000, 4096: 50_000}.get(size, 2000)
    return max(50, int(trips * scale)), max(100, int(messages * scale))


# ----------------------------------------------------------------------------- the peer's side
def serve(recv: Callable[[], bytes], send: Callable[[bytes], None], echo: bool) -> None:
    """Answer the parent's commands: b'echo N' (echo N messages), b'sink N' (read N, then ack), b'quit'."""
    while True:
        command = recv()
        if command == QUIT:
            return
        mode, count = command.split()
        if mode == b"echo":
            for _ in range(int(count)):
                message = recv()
                if echo:
                    send(message)
        else:
            for _ in range(int(count)):
                recv()
            send(b"done")


def _peer_main(config: dict) -> None:
    parent = pid_check(os.getppid(), "benchmark")
    if config["transport"] == "zmq-ipc":
        import zmq

        context = zmq.Context()
        pull = context.socket(zmq.PULL)
        pull.connect(config["down"])
        push = context.socket(zmq.PUSH)
        push.connect(config["up"])
        serve(pull.recv, push.send, echo=True)
        pull.close(linger=0)
        push.close(linger=0)
        context.term()
        return
    spin_us = config["spin_us"]
    down_spec = RingSpec.from_json(config["down"])
    if down_spec.kind == "broadcast":
        down = BroadcastRing.attach(down_spec, config["reader"], spin_us=spin_us)
    else:
        down = SpscRing.attach(down_spec, spin_us=spin_us)
    up = SpscRing.attach(RingSpec.from_json(config["up"]), spin_us=spin_us)
    for ring in (down, up):
        ring.set_peer_check(parent)
    serve(down.read, up.write, echo=config.get("reader", 0) == 0)
    down.close()
    up.close()


def _queue_peer(down: multiprocessing.Queue, up: multiprocessing.Queue) -> None:
    serve(down.get, up.put, echo=True)


# ----------------------------------------------------------------------------- the parent's side
class Link:
    """The parent's end of one transport: send to the peer(s), receive echoes, one ack per peer, stop."""

    def __init__(self, send: Callable[[bytes], None], recv: Callable[[], bytes],
                 acks: list[Callable[[], bytes]], stop: Callable[[], None]) -> None:
        self.send, self.recv, self.acks, self._stop = send, recv, acks, stop

    def close(self) -> None:
        self.send(QUIT)
        self._stop()


def _spawn_peer(config: dict) -> subprocess.Popen:
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen([sys.executable, "-m", "tools.bench_ipc", json.dumps(config)], cwd=cwd)


def _ring_link(spin_us: int, num_readers: int) -> Link:
    if num_readers == 1:
        down = SpscRing.create(RING_BYTES, spin_us=spin_us)
    else:
        down = BroadcastRing.create(RING_BYTES, num_readers, spin_us=spin_us)
    ups = [SpscRing.create(RING_BYTES, spin_us=spin_us) for _ in range(num_readers)]
    peers = [
        _spawn_peer({"transport": "ring", "spin_us": spin_us, "reader": k,
                     "down": down.spec.to_json().decode(), "up": up.spec.to_json().decode()})
        for k, up in enumerate(ups)
    ]
    checks = [popen_check(peer, f"peer {k}") for k, peer in enumerate(peers)]
    down.set_peer_check(lambda: [check() for check in checks])
    for up, check in zip(ups, checks, strict=True):
        up.set_peer_check(check)

    def stop() -> None:
        for peer in peers:
            peer.wait(timeout=30)
        for ring in [down, *ups]:
            ring.close()

    return Link(down.write, ups[0].read, [up.read for up in ups], stop)


def _zmq_link(workdir: str) -> Link:
    import zmq

    context = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    down, up = f"ipc://{workdir}/down", f"ipc://{workdir}/up"
    push.bind(down)
    pull.bind(up)
    peer = _spawn_peer({"transport": "zmq-ipc", "down": down, "up": up})

    def stop() -> None:
        peer.wait(timeout=30)
        push.close(linger=0)
        pull.close(linger=0)
        context.term()

    return Link(push.send, pull.recv, [pull.recv], stop)


def _queue_link() -> Link:
    context = multiprocessing.get_context("spawn")
    down, up = context.Queue(), context.Queue()
    peer = context.Process(target=_queue_peer, args=(down, up), daemon=True)
    peer.start()

    def stop() -> None:
        peer.join(timeout=30)

    return Link(down.put, up.get, [up.get], stop)


def _open(transport: str, workdir: str, spin_us: int) -> Link:
    if transport == "ring-spin":
        return _ring_link(spin_us, 1)
    if transport == "ring-sleep":
        return _ring_link(0, 1)
    if transport == "broadcast-2":
        return _ring_link(spin_us, 2)
    if transport == "zmq-ipc":
        return _zmq_link(workdir)
    return _queue_link()


def _percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def _round_trips(link: Link, payload: bytes, trips: int) -> list[float]:
    """Sorted round-trip times in seconds."""
    send, recv, clock = link.send, link.recv, time.perf_counter
    send(b"echo %d" % trips)
    latencies = []
    for _ in range(trips):
        start = clock()
        send(payload)
        recv()
        latencies.append(clock() - start)
    return sorted(latencies)


def _one_way(link: Link, payload: bytes, messages: int) -> float:
    """Messages per second from the first send to the last peer's ack."""
    send = link.send
    send(b"sink %d" % messages)
    start = time.perf_counter()
    for _ in range(messages):
        send(payload)
    for ack in link.acks:
        ack()
    return messages / (time.perf_counter() - start)


def measure(link: Link, size: int, scale: float, repeat: int = 1) -> dict:
    """Each figure is the median over `repeat` rounds, after a warm-up round that is thrown away."""
    trips, messages = _plan(size, scale)
    payload = os.urandom(size)
    _round_trips(link, payload, trips)  # the first trips after a peer starts run slow (page faults, cold caches)
    rounds = [_round_trips(link, payload, trips) for _ in range(repeat)]
    rates = [_one_way(link, payload, messages) for _ in range(repeat)]
    msgs_per_s = statistics.median(rates)
    return {
        "size": size,
        "rt_p50_us": statistics.median(_percentile(r, 0.50) for r in rounds) * 1e6,
        "rt_p99_us": statistics.median(_percentile(r, 0.99) for r in rounds) * 1e6,
        "msgs_per_s": msgs_per_s,
        "mb_per_s": msgs_per_s * size / 1e6,
        "round_trips": trips,
        "messages": messages,
        "rounds": repeat,
    }


def run(
    transports: tuple[str, ...], sizes: tuple[int, ...], scale: float, spin_us: int = 1000, repeat: int = 1
) -> dict:
    results = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ringserve-bench-") as workdir:
        for transport in transports:
            link = _open(transport, workdir, spin_us)
            try:
                for size in sizes:
                    results.append({"transport": transport, **measure(link, size, scale, repeat)})
            finally:
                link.close()
    return {
        "cpus": os.cpu_count(),
        "spin_us": spin_us,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
        "ratios": _ratios(results),
    }


def _ratios(results: list[dict]) -> dict:
    """How many times lower the spinning ring's p50 round trip is than each peer's, per size."""
    by = {(r["transport"], r["size"]): r for r in results}
    ratios = {}
    for (transport, size), row in by.items():
        ring = by.get(("ring-spin", size))
        if ring and transport in ("zmq-ipc", "mp-queue"):
            ratios[f"{transport}/ring-spin rt_p50 @{size}"] = round(row["rt_p50_us"] / ring["rt_p50_us"], 1)
    return ratios


def _table(report: dict) -> str:
    lines = [f"{'transport':<12} {'size':>8} {'rt p50 us':>10} {'rt p99 us':>10} {'msgs/s':>12} {'MB/s':>9}"]
    for r in report["results"]:
        size = f"{r['size'] // 1024} KiB" if r["size"] >= 1024 else f"{r['size']} B"
        lines.append(
            f"{r['transport']:<12} {size:>8} {r['rt_p50_us']:>10.1f} {r['rt_p99_us']:>10.1f} "
            f"{r['msgs_per_s']:>12,.0f} {r['mb_per_s']:>9.1f}"
        )
    for name, ratio in report["ratios"].items():
        lines.append(f"{name}: {ratio}x")
    lines.append(
        f"spin_us {report['spin_us']}; cpus {report['cpus']}; load average before {report['load_before']}, "
        f"after {report['load_after']}"
    )
    return "\n".join(lines)


@click.command("ipc")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
@click.option("--transport", "transports", multiple=True, type=click.Choice(TRANSPORTS),
              help="Measure only these (repeatable); default: all, zmq-ipc when pyzmq is installed.")
@click.option("--size", "sizes", multiple=True, type=int, help="Message sizes in bytes (repeatable).")
@click.option("--scale", default=1.0, show_default=True, help="Multiply the message counts (0.1 for a quick look).")
@click.option("--spin-us", default=1000, show_default=True, help="Spin window of ring-spin and broadcast-2.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1),
              help="Rounds per figure, reporting the median (3 or more on a shared machine).")
def cli(
    as_json: bool, transports: tuple[str, ...], sizes: tuple[int, ...], scale: float, spin_us: int, repeat: int
) -> None:
    """Round-trip latency and one-way throughput of the shm rings against pyzmq ipc and multiprocessing.Queue."""
    if not transports:
        transports = tuple(t for t in TRANSPORTS if t != "zmq-ipc" or _has_zmq())
    report = run(transports, sizes or SIZES, scale, spin_us, repeat)
    click.echo(json.dumps(report) if as_json else _table(report))


def _has_zmq() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    _peer_main(json.loads(sys.argv[1]))
