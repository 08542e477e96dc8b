"""The message codec of every channel: msgspec Structs as msgpack, arrays as raw little-endian bytes.

No pickle anywhere. A channel builds one `Codec` for its union of message types; token ids, handles and
counts travel as raw bytes (`pack`/`unpack`), which msgpack copies as one blob instead of one object per
element.
"""

from __future__ import annotations

import msgspec
import numpy as np

INT32 = np.dtype("<i4")
INT64 = np.dtype("<i8")
FLOAT32 = np.dtype("<f4")


def pack(values, dtype: np.dtype = INT32) -> bytes:
    """A sequence or array of numbers as raw little-endian bytes of `dtype`."""
    return np.asarray(values, dtype=dtype).tobytes()


def unpack(data: bytes | memoryview, dtype: np.dtype = INT32) -> np.ndarray:
    """Raw bytes back as a read-only numpy array, without copying."""
    return np.frombuffer(data, dtype=dtype)


def pack_tokens(token_ids) -> bytes:
    return pack(token_ids, INT32)


def unpack_tokens(data: bytes | memoryview) -> list[int]:
    return np.frombuffer(data, dtype=INT32).tolist()


class Codec:
    """A reusable msgpack encoder/decoder pair for one channel's message type (often a tagged union)."""

    __slots__ = ("_encoder", "_decoder")

    def __init__(self, message_type) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(message_type)

    def encode(self, msg) -> bytes:
        return self._encoder.encode(msg)

    def encode_into(self, msg, buffer: bytearray, offset: int = 0) -> None:
        self._encoder.encode_into(msg, buffer, offset)

    def decode(self, data: bytes | memoryview):
        return self._decoder.decode(data)
