"""The broadcast ring: one writer, N readers, each reader with its own read counter on its own cache line.

The writer waits for the slowest reader; every reader sees every message in order. Executors decode the
scheduler's step straight from the shared buffer with `read_view` (DESIGN §3), so the decode is the only copy.
The frame format, fences and waiting are those of ring.py.
"""

from __future__ import annotations

from shm.ring import Ring, RingSpec


class BroadcastRing(Ring):
    """The writer creates it; reader k (0 <= k < num_readers) attaches the spec with `attach(spec, k)`."""

    __slots__ = ()

    @classmethod
    def create(
        cls, capacity: int, num_readers: int, *, prefix: str = "ringserve", spin_us: int = 1000
    ) -> BroadcastRing:
        return cls._create("broadcast", capacity, num_readers, prefix, spin_us)

    @classmethod
    def attach(cls, spec: RingSpec, reader: int, *, spin_us: int = 1000) -> BroadcastRing:
        """Attach as reader `reader`; the last reader to attach unlinks the names."""
        return cls._attach(spec, "broadcast", reader, spin_us)
