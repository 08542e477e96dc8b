"""Lock-free shared-memory rings of length-framed messages; the single-producer single-consumer ring.

`Ring` holds the machinery that SpscRing and BroadcastRing share: one writer and `num_readers` readers over
the segment layout of spec.py. The writer copies the payload, fences, publishes its counter; a reader copies
(or views) the payload, fences, publishes its own counter. Python has no memory model, so each publish and
each read of the peer's counter is fenced with an uncontended lock acquire/release: two atomic
read-modify-writes, each a full barrier on x86, that no compiler moves code across. After a publish comes a
second fence before the peer's announce word is read (the eventcount's store-then-load, see wait.py).
vLLM's rings without fences hung and read stale data (issues #27858, #29389).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial

import posix_ipc

from shm.segment import Segment, unique_name, unlink_segment, unlink_semaphore
from shm.spec import HEADER, MIN_CAPACITY, SKIP, RingSpec
from shm.wait import wait_until

__all__ = ["MessageTooLarge", "Ring", "RingError", "RingSpec", "RingTimeout", "SpscRing"]


class RingError(RuntimeError):
    """A ring was misused or its memory is not what it should be."""


class RingTimeout(RingError, TimeoutError):
    """A bounded wait on a ring expired."""


class MessageTooLarge(RingError, ValueError):
    """A message can never fit the ring."""


_VIEW_HELD = "release the message from read_view (leave its `with` block) before reading on"


class _MessageView:
    """The context manager of `read_view`: yields a read-only view of a message, then releases its frame."""

    __slots__ = ("_ring", "view", "end")

    def __init__(self, ring: Ring) -> None:
        self._ring = ring
        self.view: memoryview | None = None
        self.end = 0

    def __enter__(self) -> memoryview:
        return self.view

    def __exit__(self, *exc_info) -> None:
        view, self.view = self.view, None
        ring = self._ring
        ring._viewing = False
        ring._publish_read(self.end)  # consumed even if a buffer made from the view leaked
        try:
            view.release()
        except BufferError:
            raise RingError(
                "a buffer export of a read_view message outlived the `with` block; the ring may overwrite "
                "it now: copy what you keep before the block ends"
            ) from None


class Ring:
    """One writer and `num_readers` readers over one segment; see SpscRing and BroadcastRing.

    One thread of a process may write and one thread may read at a time. Each side keeps its own counter
    and the last peer counter it saw in local fields, so the shared lines are read only when the ring looks
    full (writer) or empty (reader).
    """

    __slots__ = (
        "spec", "spin_us", "_seg", "_creator", "_reader", "_peer_check", "_sems", "_writer_sem", "_my_sem",
        "_mm", "_q", "_data", "_cap", "_max_message", "_wi", "_wai", "_ri", "_rai", "_reader_ri",
        "_reader_rai", "_rai0", "_reader_posted", "_single", "_acq", "_rel", "_w", "_room_end",
        "_w_announced", "_r", "_w_seen", "_r_announced", "_writer_posted", "_view_ctx", "_viewing", "_closed",
        "__weakref__",
    )

    def __init__(self, spec: RingSpec, seg: Segment, *, creator: bool, reader: int, spin_us: int) -> None:
        self.spec = spec
        self.spin_us = spin_us
        self._seg = seg
        self._creator = creator
        self._reader = reader
        self._peer_check: Callable[[], None] | None = None
        self._sems: list[posix_ipc.Semaphore] = []
        self._closed = False
        self._mm = seg.mmap
        self._q = q = seg.buf.cast("Q")
        self._data = seg.buf.toreadonly()
        self._cap = spec.capacity
        self._max_message = spec.max_message
        self._wi = spec.write_word
        self._wai = spec.writer_announce_word
        self._reader_ri = tuple(spec.read_word(k) for k in range(spec.num_readers))
        self._reader_rai = tuple(spec.reader_announce_word(k) for k in range(spec.num_readers))
        self._rai0 = self._reader_rai[0]
        self._single = spec.num_readers == 1
        self._ri = self._reader_ri[reader]
        self._rai = self._reader_rai[reader]
        fence_lock = threading.Lock()
        self._acq, self._rel = fence_lock.acquire, fence_lock.release
        self._view_ctx = _MessageView(self)
        self._viewing = False
        # writer side
        self._w = q[self._wi]
        self._room_end = min(q[i] for i in self._reader_ri) + self._cap
        self._w_announced = q[self._wai]
        self._reader_posted = [0] * spec.num_readers
        # reader side
        self._r = self._w_seen = q[self._ri]
        self._r_announced = q[self._rai]
        self._writer_posted = 0

    def _open_semaphores(self, flags: int) -> None:
        for name in self.spec.sem_names:
            self._sems.append(posix_ipc.Semaphore(name, flags, initial_value=0))
        self._writer_sem = self._sems[0]
        self._my_sem = self._sems[1 + self._reader]

    # ------------------------------------------------------------------ construction
    @classmethod
    def _create(cls, kind: str, capacity: int, num_readers: int, prefix: str, spin_us: int) -> Ring:
        if capacity < MIN_CAPACITY:
            raise ValueError(f"ring capacity must be at least {MIN_CAPACITY} bytes, got {capacity}")
        if num_readers < 1:
            raise ValueError(f"a ring needs at least one reader, got num_readers={num_readers}")
        _check_spin(spin_us)
        name = unique_name(prefix)
        spec = RingSpec(kind, name, (capacity + 7) & -8, num_readers, os.getpid())
        ring = cls(spec, Segment.create(name, spec.segment_size), creator=True, reader=0, spin_us=spin_us)
        # A creator that exits (or drops the ring) without close() still removes the names.
        weakref.finalize(ring, unlink_names, spec)
        try:
            ring._open_semaphores(posix_ipc.O_CREX)
        except BaseException:
            ring.close()
            raise
        for i, word in enumerate(spec.header):
            ring._q[spec.header_word + i] = word
        return ring

    @classmethod
    def _attach(cls, spec: RingSpec, kind: str, slot: int, spin_us: int) -> Ring:
        if spec.kind != kind:
            raise RingError(f"ring {spec.name} is a {spec.kind} ring, not a {kind} ring")
        if not 0 <= slot < spec.num_readers:
            raise ValueError(f"reader {slot} out of range: ring {spec.name} has {spec.num_readers} readers")
        _check_spin(spin_us)
        seg = Segment.attach(spec.name)
        if seg.size < spec.segment_size:
            seg.close()
            raise RingError(f"segment {spec.name} is {seg.size} bytes, smaller than its spec says")
        ring = cls(spec, seg, creator=False, reader=slot, spin_us=spin_us)
        try:
            q = ring._q
            if tuple(q[spec.header_word : spec.header_word + 3]) != spec.header:
                raise RingError(f"segment {spec.name} does not hold the ring its spec describes")
            ring._open_semaphores(0)
            if q[spec.attached_word(slot)]:
                raise RingError(f"reader {slot} of ring {spec.name} is attached already")
            q[spec.attached_word(slot)] = 1
            ring._fence()
            if all(q[spec.attached_word(k)] for k in range(spec.num_readers)):
                ring.unlink()  # every peer is in: no crash can leak the names any more
        except BaseException:
            ring.close()
            raise
        return ring

    # ------------------------------------------------------------------ common
    def set_peer_check(self, check: Callable[[], None] | None) -> None:
        """Called at least every ~100 ms while blocked; it raises (PeerDiedError) when the peer is dead."""
        self._peer_check = check

    def _fence(self) -> None:
        self._acq()
        self._rel()

    def unlink(self) -> None:
        """Remove the names of the segment and semaphores (idempotent); attached processes keep the ring."""
        unlink_names(self.spec)

    def close(self) -> None:
        """Unmap and close (idempotent). The creator also unlinks, so nobody can attach afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._creator:
            self.unlink()
        for sem in self._sems:
            sem.close()
        self._q.release()
        self._data.release()
        self._seg.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, capacity={self._cap})"

    # ------------------------------------------------------------------ writer
    def write(self, data: bytes | bytearray | memoryview, timeout: float | None = 30.0) -> None:
        """Append one message; while the ring is full, wait up to `timeout` s (None: no limit)."""
        cls = data.__class__
        if cls is not bytes and cls is not bytearray:
            data = memoryview(data).cast("B")
        n = len(data)
        size = (n + HEADER + 7) & -8
        w = self._w
        off = w % self._cap
        if off + size > self._cap or w + size > self._room_end:
            w, off = self._make_room(n, size, timeout)
        self._mm[off + HEADER : off + HEADER + n] = data
        q = self._q
        q[off >> 3] = n
        self._acq()
        self._rel()
        w += size
        q[self._wi] = w
        self._w = w
        self._acq()
        self._rel()
        if self._single and q[self._rai0] == self._reader_posted[0]:
            return
        self._wake_readers()

    def _wake_readers(self) -> None:
        q = self._q
        posted = self._reader_posted
        for k, index in enumerate(self._reader_rai):
            announced = q[index]
            if announced != posted[k]:
                posted[k] = announced
                self._sems[1 + k].release()

    def _min_read(self) -> int:
        q = self._q
        r = min(q[i] for i in self._reader_ri)
        self._fence()
        return r

    def _has_room(self, end: int) -> bool:
        self._room_end = self._min_read() + self._cap
        return end <= self._room_end

    def _make_room(self, n: int, size: int, timeout: float | None) -> tuple[int, int]:
        """Wait for room for a `size`-byte frame, covering the tail with SKIP first when the frame must wrap."""
        if n > self._max_message:
            raise MessageTooLarge(
                f"a {n}-byte message can never fit ring {self.spec.name}: the largest is {self._max_message} "
                f"bytes (capacity {self._cap} minus the {HEADER}-byte header); make the ring larger"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        cap = self._cap
        while True:
            w = self._w
            off = w % cap
            tail = cap - off
            end = w + (tail if size > tail else size)
            if not self._has_room(end) and not wait_until(
                partial(self._has_room, end),
                self._announce_writer,
                self._writer_sem,
                deadline,
                self.spin_us,
                self._peer_check,
            ):
                raise self._full_error(n, timeout)
            if size <= tail:
                return w, off
            # Publish the SKIP on its own: the frame may need room that readers free only once past it.
            self._q[off >> 3] = SKIP
            self._fence()
            self._w = w + tail
            self._q[self._wi] = w + tail
            self._fence()
            self._wake_readers()

    def _announce_writer(self) -> None:
        self._w_announced += 1
        self._q[self._wai] = self._w_announced
        self._fence()

    def _full_error(self, n: int, timeout: float | None) -> RingTimeout:
        unread = [self._w - self._q[i] for i in self._reader_ri]
        slowest = max(range(len(unread)), key=unread.__getitem__)
        who = "the reader" if self._single else f"reader {slowest} (the slowest)"
        return RingTimeout(
            f"ring {self.spec.name} stayed full for {timeout} s: no room for a {n}-byte message because "
            f"{who} has not drained it ({unread[slowest]} of {self._cap} bytes unread)"
        )

    # ------------------------------------------------------------------ reader
    def try_read(self) -> bytes | None:
        """The next message as bytes, or None at once when there is none."""
        r = self._r
        if r == self._w_seen:
            w = self._q[self._wi]
            self._acq()
            self._rel()
            if w == r:
                return None
            self._w_seen = w
        if self._viewing:
            raise RingError(_VIEW_HELD)
        q = self._q
        off = r % self._cap
        n = q[off >> 3]
        if n > self._max_message:
            self._pass_marker(r, off, n)
            return self.try_read()
        data = self._mm[off + HEADER : off + HEADER + n]
        self._acq()
        self._rel()
        r += (n + HEADER + 7) & -8
        q[self._ri] = r
        self._r = r
        self._acq()
        self._rel()
        if q[self._wai] != self._writer_posted:
            self._wake_writer()
        return data

    def _pass_marker(self, r: int, off: int, header: int) -> None:
        if header != SKIP:
            raise RingError(f"ring {self.spec.name}: corrupt frame header {header:#x} at offset {off}")
        self._publish_read(r + self._cap - off)

    def _publish_read(self, r: int) -> None:
        self._fence()
        self._q[self._ri] = r
        self._r = r
        self._fence()
        if self._q[self._wai] != self._writer_posted:
            self._wake_writer()

    def _wake_writer(self) -> None:
        announced = self._q[self._wai]
        if announced != self._writer_posted:
            self._writer_posted = announced
            self._writer_sem.release()

    def _readable(self) -> bool:
        return self._q[self._wi] != self._r

    def _announce_reader(self) -> None:
        self._r_announced += 1
        self._q[self._rai] = self._r_announced
        self._fence()

    def wait_readable(self, timeout: float | None, spin_us: int | None = None) -> bool:
        """True once a message (or a wrap marker) waits; False after `timeout` s (None: no limit)."""
        if self._r != self._w_seen or self._readable():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        return wait_until(
            self._readable,
            self._announce_reader,
            self._my_sem,
            deadline,
            self.spin_us if spin_us is None else spin_us,
            self._peer_check,
        )

    def _await_frame(self, deadline: float | None, timeout: float | None, spin_us: int | None) -> None:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.wait_readable(remaining, spin_us):
            raise RingTimeout(f"ring {self.spec.name}: no message within {timeout} s")

    def read(self, timeout: float | None = None, spin_us: int | None = None) -> bytes:
        """The next message as bytes; waits up to `timeout` s (None: no limit), then raises RingTimeout."""
        data = self.try_read()
        if data is not None:
            return data
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._await_frame(deadline, timeout, spin_us)
            data = self.try_read()
            if data is not None:
                return data

    def read_view(self, timeout: float | None = None, spin_us: int | None = None) -> _MessageView:
        """`with ring.read_view() as view:` a read-only zero-copy view of the next message, released on exit.

        Decode it inside the block (msgspec copies what it keeps): the writer may reuse the memory after the
        block. The view is released there; a buffer export still held on it raises RingError, but arrays
        made from it (np.frombuffer) are not tracked: copy what you keep.
        """
        if self._viewing:
            raise RingError(_VIEW_HELD)
        deadline = None if timeout is None else time.monotonic() + timeout
        q = self._q
        while True:
            r = self._r
            if r == self._w_seen:
                self._w_seen = q[self._wi]
                self._fence()
            if r != self._w_seen:
                off = r % self._cap
                n = q[off >> 3]
                if n <= self._max_message:
                    ctx = self._view_ctx
                    ctx.view = self._data[off + HEADER : off + HEADER + n]
                    ctx.end = r + ((n + HEADER + 7) & -8)
                    self._viewing = True
                    return ctx
                self._pass_marker(r, off, n)
                continue
            self._await_frame(deadline, timeout, spin_us)


class SpscRing(Ring):
    """A single-producer single-consumer ring. Either side may create it; the other attaches its spec."""

    __slots__ = ()

    @classmethod
    def create(cls, capacity: int, *, prefix: str = "ringserve", spin_us: int = 1000) -> SpscRing:
        return cls._create("spsc", capacity, 1, prefix, spin_us)

    @classmethod
    def attach(cls, spec: RingSpec, *, spin_us: int = 1000) -> SpscRing:
        """Attach the other side; both sides are in then, so the names are unlinked at once."""
        return cls._attach(spec, "spsc", 0, spin_us)


def unlink_names(spec: RingSpec) -> None:
    """Remove a ring's segment and semaphore names (idempotent)."""
    unlink_segment(spec.name)
    for name in spec.sem_names:
        unlink_semaphore(name)


def _check_spin(spin_us: int) -> None:
    if spin_us < 0:
        raise ValueError(f"spin_us must be >= 0, got {spin_us}")
