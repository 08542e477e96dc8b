"""SpscRing in one process: framing, wrap-around, limits, timeouts, zero-copy views, waking and naming."""

from __future__ import annotations

import array
import os
import struct
import threading
import time

import numpy as np
import pytest

from shm.ring import MessageTooLarge, RingError, RingSpec, RingTimeout, SpscRing
from shm.spec import HEADER, frame_size
from shm.wait import PeerDiedError
from tests.shm.conftest import entries_of


@pytest.fixture
def pair(prefix):
    """A ring and its attached other side (writer, reader)."""
    writer = SpscRing.create(1024, prefix=prefix)
    reader = SpscRing.attach(RingSpec.from_json(writer.spec.to_json()))
    yield writer, reader
    reader.close()
    writer.close()


def test_messages_round_trip_in_order_with_every_size(pair):
    writer, reader = pair
    sizes = list(range(0, writer.spec.max_message + 1, 7)) + [writer.spec.max_message]
    messages = [os.urandom(n) for n in sizes] * 3
    got = []
    # A frame that wraps waits for the reader to pass the SKIP marker, so the reader runs beside the writer.
    thread = threading.Thread(target=lambda: got.extend(reader.read(timeout=5) for _ in messages))
    thread.start()
    for message in messages:
        writer.write(message, timeout=5)
    thread.join(10)
    assert got == messages
    assert reader.try_read() is None


def test_wrap_keeps_every_message_contiguous(pair):
    writer, reader = pair
    capacity = writer.spec.capacity
    size = capacity // 3  # three frames do not fit: every third one wraps behind a SKIP marker
    for i in range(20):
        message = bytes([i]) * size
        writer.write(message, timeout=0)
        with reader.read_view(timeout=0) as view:
            assert view.nbytes == size
            assert view == message
    assert reader._r > 5 * capacity  # the counters went round several times


def test_accepts_bytearray_memoryview_and_typed_buffers(pair):
    writer, reader = pair
    ints = array.array("i", [1, -2, 3])
    writer.write(bytearray(b"abc"))
    writer.write(memoryview(b"xyzw")[1:3])
    writer.write(memoryview(ints))
    writer.write(np.arange(4, dtype=np.int64))
    assert reader.read(timeout=0) == b"abc"
    assert reader.read(timeout=0) == b"yz"
    assert reader.read(timeout=0) == ints.tobytes()
    assert np.array_equal(np.frombuffer(reader.read(timeout=0), np.int64), np.arange(4))


def test_capacity_is_rounded_up_to_whole_words(prefix):
    with SpscRing.create(1001, prefix=prefix) as ring:
        assert ring.spec.capacity == 1008
        assert ring.spec.max_message == 1008 - HEADER


def test_bad_arguments_are_rejected_with_their_name(prefix):
    with pytest.raises(ValueError, match="capacity"):
        SpscRing.create(16, prefix=prefix)
    with pytest.raises(ValueError, match="spin_us"):
        SpscRing.create(1024, prefix=prefix, spin_us=-1)
    with pytest.raises(ValueError, match="prefix"):
        SpscRing.create(1024, prefix="bad/name")


def test_oversized_message_is_rejected_and_the_ring_stays_usable(pair):
    writer, reader = pair
    largest = writer.spec.max_message
    with pytest.raises(MessageTooLarge, match=f"{largest + 1}-byte message can never fit.*largest is {largest}"):
        writer.write(b"x" * (largest + 1), timeout=0)
    writer.write(b"y" * largest, timeout=0)
    assert reader.read(timeout=0) == b"y" * largest
    assert isinstance(MessageTooLarge("x"), ValueError)


def test_full_ring_times_out_with_a_clear_error(pair):
    writer, reader = pair
    frame = frame_size(100)
    for _ in range(writer.spec.capacity // frame):
        writer.write(b"a" * 100, timeout=0)
    start = time.monotonic()
    with pytest.raises(RingTimeout, match=r"stayed full for 0.2 s.*the reader has not drained it"):
        writer.write(b"b" * 100, timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2.0
    assert isinstance(RingTimeout("x"), TimeoutError)


def test_blocked_writer_resumes_when_the_reader_drains(pair):
    writer, reader = pair
    with pytest.raises(RingTimeout):
        while True:
            writer.write(b"a" * 100, timeout=0)

    def drain_later():
        time.sleep(0.2)
        reader.read(timeout=1)

    drainer = threading.Thread(target=drain_later)
    drainer.start()
    start = time.monotonic()
    writer.write(b"b" * 100, timeout=5.0)
    waited = time.monotonic() - start
    drainer.join()
    assert 0.15 < waited < 2.0


def test_empty_ring_read_times_out(pair):
    _, reader = pair
    assert reader.try_read() is None
    start = time.monotonic()
    with pytest.raises(RingTimeout, match="no message within 0.1 s"):
        reader.read(timeout=0.1)
    assert 0.08 < time.monotonic() - start < 1.0
    assert reader.wait_readable(0.05) is False


@pytest.mark.parametrize("spin_us", [0, 1000, 1_000_000])
def test_sleeping_or_spinning_reader_is_woken_by_the_writer(pair, spin_us, monkeypatch):
    monkeypatch.setattr("shm.wait.SLEEP_SLICE_S", 2.0)  # so only a post can wake the sleeper in time
    writer, reader = pair
    got = []
    thread = threading.Thread(target=lambda: got.append(reader.read(timeout=5, spin_us=spin_us)))
    thread.start()
    time.sleep(0.3)  # past the spin window (or inside the long one): the reader sleeps or spins
    start = time.monotonic()
    writer.write(b"wake")
    thread.join(5)
    assert got == [b"wake"]
    assert time.monotonic() - start < 0.5


def test_a_lost_wakeup_costs_one_sleep_slice_not_a_hang(pair, monkeypatch):
    writer, reader = pair
    monkeypatch.setattr(type(writer), "_wake_readers", lambda self: None)  # every post is lost
    got = []
    thread = threading.Thread(target=lambda: got.append(reader.read(timeout=5, spin_us=0)))
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    writer.write(b"late")
    thread.join(5)
    assert got == [b"late"]
    assert time.monotonic() - start < 0.5


def test_idle_reader_uses_almost_no_cpu(pair):
    _, reader = pair
    cpu = time.thread_time()
    with pytest.raises(RingTimeout):
        reader.read(timeout=2.0)  # default spin window, then sleeps
    assert time.thread_time() - cpu < 0.1  # < 5 % of a core


def test_blocked_wait_calls_the_peer_check_and_raises(pair):
    writer, reader = pair
    calls = []

    def check():
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise PeerDiedError("writer (pid 1) was killed by signal SIGKILL")

    reader.set_peer_check(check)
    start = time.monotonic()
    with pytest.raises(PeerDiedError, match="SIGKILL"):
        reader.read(timeout=5)
    assert time.monotonic() - start < 1.0
    assert all(b - a < 0.2 for a, b in zip(calls, calls[1:], strict=False))
    writer.write(b"x")  # the fast path never calls it
    assert reader.read(timeout=0) == b"x" and len(calls) == 3


def test_read_view_is_zero_copy_and_read_only(pair):
    writer, reader = pair
    writer.write(b"hello")
    with reader.read_view(timeout=0) as view:
        assert view.readonly and bytes(view) == b"hello"
        writer._seg.buf[HEADER : HEADER + 1] = b"j"  # the same memory, not a copy
        assert bytes(view) == b"jello"
        with pytest.raises(RingError, match="release the message"):
            reader.try_read()
        with pytest.raises(RingError, match="release the message"):
            reader.read_view(timeout=0)
    with pytest.raises(ValueError):
        view.tobytes()  # released with the block
    assert reader.try_read() is None


def test_a_buffer_export_that_outlives_read_view_is_an_error(pair):
    writer, reader = pair
    writer.write(struct.pack("<4i", 0, 1, 2, 3))
    with pytest.raises(RingError, match="outlived"):
        with reader.read_view(timeout=0) as view:
            pending = struct.iter_unpack("<i", view)  # holds a buffer export of the view until exhausted
    assert [v for (v,) in pending] == [0, 1, 2, 3]
    assert reader.try_read() is None  # the message counts as consumed all the same


def test_corrupt_frame_header_is_reported(pair):
    writer, reader = pair
    writer.write(b"abc")
    reader._q[0] = 1 << 40  # a length no frame can have
    with pytest.raises(RingError, match="corrupt frame header"):
        reader.try_read()


def test_names_are_unlinked_once_the_peer_attached(prefix):
    writer = SpscRing.create(1024, prefix=prefix)
    assert len(entries_of(prefix)) == 3  # the segment and two semaphores
    spec = writer.spec
    reader = SpscRing.attach(spec)
    assert entries_of(prefix) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SpscRing.attach(spec)
    writer.write(b"still works")
    assert reader.read(timeout=1) == b"still works"
    reader.close()
    writer.close()
    writer.close()  # idempotent


def test_creator_close_unlinks_when_nobody_attached(prefix):
    ring = SpscRing.create(1024, prefix=prefix)
    ring.unlink()
    ring.unlink()  # idempotent
    assert entries_of(prefix) == []
    ring.close()


def test_attach_checks_the_spec(pair, prefix):
    writer, _ = pair
    wrong_kind = RingSpec("broadcast", writer.spec.name, 1024, 1, os.getpid())
    with pytest.raises(RingError, match="is a broadcast ring"):
        SpscRing.attach(wrong_kind)
    other = SpscRing.create(2048, prefix=prefix)
    lying = RingSpec("spsc", other.spec.name, 1024, 1, os.getpid())
    with pytest.raises(RingError, match="does not hold the ring its spec describes"):
        SpscRing.attach(lying)
    other.close()
