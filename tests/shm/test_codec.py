"""The message codec: msgpack Structs (tagged unions), raw little-endian arrays, decoding in place."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from shm.codec import FLOAT32, INT32, INT64, Codec, pack, pack_tokens, unpack, unpack_tokens


class Add(msgspec.Struct, tag="add", array_like=True):
    req: int
    tokens: bytes


class Abort(msgspec.Struct, tag="abort", array_like=True):
    reqs: bytes


def test_pack_is_raw_little_endian_of_the_dtype():
    assert pack([1, -2], INT32) == b"\x01\x00\x00\x00\xfe\xff\xff\xff"
    assert pack([1], INT64) == b"\x01" + b"\x00" * 7
    assert pack(np.array([0.5], dtype=">f4"), FLOAT32) == np.float32(0.5).tobytes()  # byte order fixed
    assert pack([]) == b""


def test_unpack_is_a_read_only_view_without_a_copy():
    raw = bytearray(pack([5, 6, 7]))
    values = unpack(memoryview(raw))
    assert values.tolist() == [5, 6, 7] and values.dtype == INT32
    raw[0] = 9
    assert values[0] == 9  # shares the buffer
    assert not unpack(bytes(raw)).flags.writeable


def test_token_helpers_round_trip_python_lists():
    tokens = [0, 1, 151_642, 2**31 - 1]
    assert unpack_tokens(pack_tokens(tokens)) == tokens
    assert isinstance(unpack_tokens(pack_tokens(tokens))[0], int)


def test_codec_decodes_a_tagged_union_and_rejects_other_shapes():
    codec = Codec(Add | Abort)
    messages = [Add(3, pack_tokens([1, 2])), Abort(pack([3], INT64))]
    for message in messages:
        assert codec.decode(codec.encode(message)) == message
    with pytest.raises(msgspec.ValidationError):
        codec.decode(msgspec.msgpack.encode(["nope", 1]))


def test_codec_encodes_into_a_buffer_and_decodes_from_a_memoryview():
    codec = Codec(Add)
    buffer = bytearray(b"HDR!")
    codec.encode_into(Add(1, b"xy"), buffer, 4)
    assert buffer[:4] == b"HDR!"
    decoded = codec.decode(memoryview(buffer)[4:])
    assert decoded == Add(1, b"xy")
    buffer[-1:] = b"z"
    assert decoded.tokens == b"xy"  # bytes fields are copies: safe after a ring releases the view
