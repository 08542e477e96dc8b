"""Reading a GGUF file's header: its metadata key-values and the table of tensors (name, shape, type, offset).

The format (version 2 and 3): magic "GGUF", version, tensor count, key-value count, the key-values, the
tensor infos, then the tensor data aligned to `general.alignment` (32 bytes by default). This reader is
stdlib-only and walks the header with struct over an mmap: `gguf.GGUFReader` builds a numpy view per
field part, which takes 10-25 s on a 2-core machine for a vocabulary of 50k tokens and merges, and every
engine process that needs the config would pay it. Tensor data is left in place for `gguf_weights`.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
from dataclasses import dataclass

from engine.errors import ConfigError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types: id -> struct format (scalars); 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# GGML tensor types: id -> (name, elements per block, bytes per block), as the format defines them.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # as PyTorch orders it (GGUF lists the innermost dimension first)
    type_id: int
    offset: int                 # absolute byte offset of the data in the file

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"type {self.type_id}",))[0]

    @property
    def nbytes(self) -> int:
        _, block, size = GGML_TYPES[self.type_id]
        count = 1
        for dim in self.shape:
            count *= dim
        return count // block * size


@dataclass(frozen=True)
class GGUFFile:
    path: str
    version: int
    metadata: dict            # key -> int | float | bool | str | list
    tensors: dict[str, TensorInfo]


def is_gguf_path(model: str) -> bool:
    return model.lower().endswith(".gguf")


def read_gguf(path: str) -> GGUFFile:
    """The header of the GGUF file at `path` (cached per path, size and modification time)."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise ConfigError(f"GGUF file {path!r} cannot be read: {e.strerror}") from None
    return _read_cached(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFFile:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _parse(path, buf)
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as e:
            raise ConfigError(f"{path} is not a readable GGUF file (truncated or corrupt header: {e})") from None


def _parse(path: str, buf: mmap.mmap) -> GGUFFile:
    if buf[:4] != MAGIC:
        raise ConfigError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    version, tensor_count, kv_count = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ConfigError(f"{path} is GGUF version {version}; versions 2 and 3 are supported")
    reader = _Reader(buf, 24)
    metadata = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(reader.u32())
    infos = []
    for _ in range(tensor_count):
        name = reader.string()
        dims = struct.unpack_from(f"<{reader.u32()}Q", buf, reader.pos)
        reader.pos += 8 * len(dims)
        type_id, offset = reader.u32(), reader.u64()
        infos.append((name, tuple(reversed(dims)), type_id, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-reader.pos // alignment) * alignment
    tensors = {name: TensorInfo(name, shape, type_id, data_start + offset) for name, shape, type_id, offset in infos}
    return GGUFFile(path, version, metadata, tensors)


class _Reader:
    """A cursor over the header's little-endian fields."""

    def __init__(self, buf: mmap.mmap, pos: int):
        self.buf, self.pos = buf, pos

    def u32(self) -> int:
        (value,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self) -> int:
        (value,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return value

    def string(self) -> str:
        length = self.u64()
        start, self.pos = self.pos, self.pos + length
        return self.buf[start:self.pos].decode("utf-8", errors="surrogateescape")

    def value(self, type_id: int):
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type, count = self.u32(), self.u64()
            if item_type in _SCALARS:           # numbers: one unpack for the whole array
                fmt = f"<{count}{_SCALARS[item_type]}"
                values = list(struct.unpack_from(fmt, self.buf, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            return [self.value(item_type) for _ in range(count)]
        if type_id not in _SCALARS:
            raise ValueError(f"unknown metadata value type {type_id}")
        fmt = "<" + _SCALARS[type_id]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value
