"""A peer process for the ring tests, started with subprocess: `python -m tests.shm.ring_worker ROLE ...`.

Roles:
  consume      attach a ring (SPSC, or broadcast as --reader K) and check --count messages against the
               deterministic stream of --seed; --count 0 reads until killed
  produce      attach an SPSC ring and write the stream; --count 0 writes until killed
  serve        create a broadcast ring (one reader), print its spec as a JSON line, then produce
  create-only  create an SPSC ring, print its spec, and wait to be killed (nobody attaches)

It watches its parent (--parent PID) so it never outlives the test. Exit codes: 0 done, 1 a message was
wrong (the first difference is printed), 3 the peer died (PeerDiedError, printed).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from shm.broadcast import BroadcastRing
from shm.ring import Ring, RingSpec, SpscRing
from shm.wait import PeerDiedError, pid_check

CHUNK = 1 << 16


class MessageStream:
    """The same pseudo-random messages on both sides: random sizes in [0, max_size], random content."""

    def __init__(self, seed: int, max_size: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._max_size = max_size
        self._pool = memoryview(self._rng.bytes(4 * max_size + 4096))
        self._sizes: list[int] = []
        self._offsets: list[int] = []
        self._i = 0

    def __iter__(self):
        return self

    def __next__(self) -> memoryview:
        if self._i == len(self._sizes):
            self._sizes = self._rng.integers(0, self._max_size + 1, CHUNK).tolist()
            self._offsets = self._rng.integers(0, 3 * self._max_size + 4096, CHUNK).tolist()
            self._i = 0
        size, offset = self._sizes[self._i], self._offsets[self._i]
        self._i += 1
        return self._pool[offset : offset + size]


def consume(ring: Ring, stream: MessageStream, count: int) -> int:
    """Read and check `count` messages (0: forever); returns the exit code."""
    read = ring.read
    i = 0
    for expected in stream:
        if count and i == count:
            break
        got = read(timeout=30.0)
        if got != expected:
            print(f"message {i}: got {len(got)} bytes, expected {len(expected)}", flush=True)
            return 1
        i += 1
    print(f"ok {i}", flush=True)
    return 0


def produce(ring: Ring, stream: MessageStream, count: int) -> None:
    write = ring.write
    for i, message in enumerate(stream):
        if count and i == count:
            break
        write(message, timeout=30.0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["consume", "produce", "serve", "create-only"])
    parser.add_argument("--spec", help="the ring's RingSpec as JSON")
    parser.add_argument("--reader", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-size", type=int, default=256)
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--prefix", default="ringserve")
    parser.add_argument("--spin-us", type=int, default=1000)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    stream = MessageStream(args.seed, args.max_size)

    if args.role == "create-only":
        ring = SpscRing.create(args.capacity, prefix=args.prefix)
        print(ring.spec.to_json().decode(), flush=True)
        time.sleep(600)
        return 0
    if args.role == "serve":
        ring = BroadcastRing.create(args.capacity, 1, prefix=args.prefix, spin_us=args.spin_us)
        print(ring.spec.to_json().decode(), flush=True)
    else:
        spec = RingSpec.from_json(args.spec)
        if spec.kind == "broadcast":
            ring = BroadcastRing.attach(spec, args.reader, spin_us=args.spin_us)
        else:
            ring = SpscRing.attach(spec, spin_us=args.spin_us)
    ring.set_peer_check(pid_check(args.parent, "test process"))
    try:
        if args.role == "consume":
            return consume(ring, stream, args.count)
        produce(ring, stream, args.count)
        return 0
    except PeerDiedError as e:
        print(f"PeerDiedError: {e}", flush=True)
        return 3
    finally:
        ring.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
