"""BroadcastRing in one process: every reader sees every message; the writer waits for the slowest."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from shm.broadcast import BroadcastRing
from shm.ring import RingError, RingTimeout, SpscRing
from shm.spec import frame_size
from tests.shm.conftest import entries_of


@pytest.fixture
def rings(prefix):
    writer = BroadcastRing.create(1024, 3, prefix=prefix)
    readers = [BroadcastRing.attach(writer.spec, k) for k in range(3)]
    yield writer, readers
    for ring in readers + [writer]:
        ring.close()


def test_every_reader_sees_every_message_in_order(rings):
    writer, readers = rings
    messages = [bytes([i]) * (i * 37 % 300) for i in range(200)]
    got = [[] for _ in readers]
    threads = [
        threading.Thread(target=lambda r=r, g=g: g.extend(r.read(timeout=5) for _ in messages))
        for r, g in zip(readers, got, strict=True)
    ]
    for t in threads:
        t.start()
    for message in messages:
        writer.write(message, timeout=5)
    for t in threads:
        t.join(10)
    assert got == [messages] * 3


def test_the_writer_waits_for_the_slowest_reader(rings):
    writer, readers = rings
    count = writer.spec.capacity // frame_size(100)
    for _ in range(count):
        writer.write(b"m" * 100, timeout=0)
    for _ in range(count):
        readers[0].read(timeout=0)
        readers[2].read(timeout=0)
    with pytest.raises(RingTimeout, match=r"reader 1 \(the slowest\) has not drained it"):
        writer.write(b"m" * 100, timeout=0.1)
    readers[1].read(timeout=0)
    writer.write(b"m" * 100, timeout=0)


def test_readers_decode_in_place(rings):
    class Step(msgspec.Struct):
        step: int
        tokens: bytes

    writer, readers = rings
    writer.write(msgspec.msgpack.encode(Step(7, b"\x01\x02")))
    decoder = msgspec.msgpack.Decoder(Step)
    for reader in readers:
        with reader.read_view(timeout=0) as view:
            step = decoder.decode(view)
        assert step == Step(7, b"\x01\x02")


def test_sleeping_readers_are_all_woken(rings, monkeypatch):
    monkeypatch.setattr("shm.wait.SLEEP_SLICE_S", 2.0)  # only a post can wake them in time
    writer, readers = rings
    got = []
    threads = [threading.Thread(target=lambda r=r: got.append(r.read(timeout=5, spin_us=0))) for r in readers]
    for t in threads:
        t.start()
    time.sleep(0.3)
    start = time.monotonic()
    writer.write(b"go")
    for t in threads:
        t.join(5)
    assert got == [b"go"] * 3
    assert time.monotonic() - start < 1.0


def test_names_are_unlinked_when_the_last_reader_attaches(prefix):
    writer = BroadcastRing.create(256, 2, prefix=prefix)
    assert len(entries_of(prefix)) == 4  # segment, writer semaphore, two reader semaphores
    first = BroadcastRing.attach(writer.spec, 0)
    assert len(entries_of(prefix)) == 4
    with pytest.raises(RingError, match="reader 0 .* is attached already"):
        BroadcastRing.attach(writer.spec, 0)
    second = BroadcastRing.attach(writer.spec, 1)
    assert entries_of(prefix) == []
    for ring in (first, second, writer):
        ring.close()


def test_attach_rejects_a_bad_reader_index_and_the_wrong_kind(prefix):
    writer = BroadcastRing.create(256, 2, prefix=prefix)
    with pytest.raises(ValueError, match="reader 2 out of range"):
        BroadcastRing.attach(writer.spec, 2)
    with pytest.raises(RingError, match="is a broadcast ring, not a spsc ring"):
        SpscRing.attach(writer.spec)
    with pytest.raises(ValueError, match="at least one reader"):
        BroadcastRing.create(256, 0, prefix=prefix)
    writer.close()
