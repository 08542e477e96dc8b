"""What defines a ring: its spec (the names and sizes a peer attaches by) and the layout of its segment.

One segment holds the data area (`capacity` bytes at offset 0) followed by control lines of 64 bytes, so
that every counter sits on its own cache line and is written by one process only:

    line 0        write counter (monotonic byte count)              writer
    line 1        writer's announce word (eventcount, wait.py)      writer
    line 2        header: magic, capacity, num_readers              creator, once
    line 3 + 2k   reader k's read counter                           reader k
    line 4 + 2k   reader k's announce word, then its attached flag  reader k

A frame is an 8-byte length header and the payload, padded to 8 bytes. A frame never straddles the end of
the data area: one that does not fit before the end is preceded by a SKIP header over the tail and starts
at offset 0. That wastes the tail but keeps every message contiguous, so a reader can decode it in place.
A frame that wraps may need the reader past the SKIP first, so one thread alone cannot write and then read
a message larger than the space left before the end; a writer and a reader beside it always can.
Counters are byte counts that only grow (a 64-bit count of bytes never wraps in practice); a frame lives
at `counter % capacity`.
"""

from __future__ import annotations

import msgspec

LINE = 64                      # bytes per cache line
WORDS_PER_LINE = LINE // 8
HEADER = 8                     # frame header: the payload length
SKIP = (1 << 64) - 1           # frame header over the unused tail before a wrap
MAGIC = 0x31565253474E4952     # b"RINGSRV1" little-endian
MIN_CAPACITY = 64


def frame_size(payload: int) -> int:
    """Bytes a frame of `payload` bytes takes: header plus payload, padded to 8."""
    return (payload + HEADER + 7) & -8


class RingSpec(msgspec.Struct, frozen=True):
    """All a peer needs to attach to a ring; travels as JSON on a child's command line."""

    kind: str                  # "spsc" | "broadcast"
    name: str                  # the segment; semaphores are name + "-w" (writer) and name + "-r<k>" (reader k)
    capacity: int              # bytes in the data area, a multiple of 8
    num_readers: int
    creator_pid: int

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> RingSpec:
        return msgspec.json.decode(data, type=cls)

    # ------------------------------------------------------------------ names
    @property
    def writer_sem(self) -> str:
        return f"{self.name}-w"

    def reader_sem(self, reader: int) -> str:
        return f"{self.name}-r{reader}"

    @property
    def sem_names(self) -> list[str]:
        return [self.writer_sem] + [self.reader_sem(k) for k in range(self.num_readers)]

    # ------------------------------------------------------------------ layout (indices of 8-byte words)
    @property
    def segment_size(self) -> int:
        return self.capacity + LINE * (3 + 2 * self.num_readers)

    @property
    def max_message(self) -> int:
        return self.capacity - HEADER

    @property
    def write_word(self) -> int:
        return self.capacity // 8

    @property
    def writer_announce_word(self) -> int:
        return self.write_word + WORDS_PER_LINE

    @property
    def header_word(self) -> int:
        return self.write_word + 2 * WORDS_PER_LINE

    def read_word(self, reader: int) -> int:
        return self.write_word + (3 + 2 * reader) * WORDS_PER_LINE

    def reader_announce_word(self, reader: int) -> int:
        return self.read_word(reader) + WORDS_PER_LINE

    def attached_word(self, reader: int) -> int:
        return self.reader_announce_word(reader) + 1

    @property
    def header(self) -> tuple[int, int, int]:
        return (MAGIC, self.capacity, self.num_readers)
