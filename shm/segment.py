"""POSIX shared-memory segments mapped with mmap, their names, the free-space check and the stale sweep.

Names are `/<prefix>-<creator pid>-<random>`; a ring's semaphores add a suffix (`-w`, `-r0`, ...). Every
process attaches at startup and then the names are unlinked (unlink is idempotent, any side may do it), so
the memory lives exactly as long as some process maps it and no exit, crash or SIGKILL leaves an entry in
/dev/shm. A crash in the short window between create and the last attach is cleaned by `sweep_stale()`.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import time

import posix_ipc

from shm.wait import pid_alive

SHM_DIR = "/dev/shm"
_PREFIX = re.compile(r"[A-Za-z0-9_.-]+")


class ShmSpaceError(RuntimeError):
    """/dev/shm has too little free space for a segment; the message says how to grant more."""


def _human(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def check_shm_space(nbytes: int, path: str = SHM_DIR) -> None:
    """Raise ShmSpaceError unless the filesystem at `path` has `nbytes` free."""
    free = _free_bytes(path)
    if nbytes > free:
        raise ShmSpaceError(_space_message(nbytes, free, path))


def _free_bytes(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _space_message(nbytes: int, free: int, path: str) -> str:
    return (
        f"shared memory is too small: {_human(nbytes)} ({nbytes} bytes) are needed in {path} but only "
        f"{_human(free)} ({free} bytes) are free. Grant more: run the container with a larger "
        f"`docker run --shm-size=...` (Docker's default is 64 MiB) or with `--ipc=host`; on Kubernetes "
        f"mount an emptyDir with medium: Memory at /dev/shm. Or make the rings smaller (ring_bytes)."
    )


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"shm name prefix must be letters, digits, '_', '.' or '-', got {prefix!r}")
    return prefix


def unique_name(prefix: str = "ringserve") -> str:
    """A fresh segment name, `/<prefix>-<pid>-<random>`, unique per engine instance."""
    return f"/{check_prefix(prefix)}-{os.getpid()}-{secrets.token_hex(6)}"


class Segment:
    """One POSIX shared-memory segment mapped into this process; `buf` is a writable memoryview of it."""

    __slots__ = ("name", "size", "mmap", "buf")

    def __init__(self, name: str, size: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.size = size
        self.mmap = mapping
        self.buf = memoryview(mapping)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create and map a new zero-filled segment; its pages are reserved now, not at first touch."""
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        check_shm_space(size)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=size)
        try:
            # Reserve the pages: a full tmpfs then fails here with ENOSPC instead of SIGBUS at first write.
            os.posix_fallocate(shm.fd, 0, size)
            mapping = mmap.mmap(shm.fd, size)
        except OSError as e:
            shm.close_fd()
            unlink_segment(name)
            if e.errno == errno.ENOSPC:  # taken by someone else since the check
                raise ShmSpaceError(_space_message(size, _free_bytes(SHM_DIR), SHM_DIR)) from e
            raise
        shm.close_fd()
        return cls(name, size, mapping)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment by name."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise FileNotFoundError(
                f"shared-memory segment {name} does not exist: its creator exited, or every peer already "
                f"attached and the name was unlinked"
            ) from None
        size = shm.size
        try:
            mapping = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, size, mapping)

    def unlink(self) -> None:
        """Remove the name (idempotent); the memory stays mapped in every process that attached."""
        unlink_segment(self.name)

    def close(self) -> None:
        """Unmap. A buffer still exported from `buf` keeps the mapping alive until it is released."""
        self.buf.release()
        try:
            self.mmap.close()
        except BufferError:
            pass  # someone still holds a view; the mapping goes when the last view does

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, size={self.size})"


def unlink_segment(name: str) -> None:
    """Remove a segment's name (idempotent)."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


def unlink_semaphore(name: str) -> None:
    """Remove a semaphore's name (idempotent)."""
    try:
        posix_ipc.unlink_semaphore(name)
    except posix_ipc.ExistentialError:
        pass


def sweep_stale(prefix: str = "ringserve", min_age_s: float = 60.0) -> list[str]:
    """Unlink the segments and semaphores of `prefix` whose creator pid is dead; returns the /dev/shm names.

    Entries younger than `min_age_s` are kept: with /dev/shm shared across pid namespaces (`--ipc=host`)
    another container's pid looks dead here, and its engine may still be between create and attach.
    """
    pattern = re.compile(rf"(sem\.)?({re.escape(check_prefix(prefix))}-(\d+)-[0-9a-f]+(?:-[a-z0-9]+)?)")
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    now = time.time()
    removed = []
    for entry in sorted(entries):
        match = pattern.fullmatch(entry)
        if match is None or pid_alive(int(match.group(3))):
            continue
        try:
            age = now - os.stat(os.path.join(SHM_DIR, entry)).st_mtime
        except FileNotFoundError:
            continue
        if age < min_age_s:
            continue
        name = "/" + match.group(2)
        if match.group(1):
            unlink_semaphore(name)
        else:
            unlink_segment(name)
        removed.append(entry)
    return removed
