"""Segments: create/attach/unlink/close, unique names, the free-space check and the stale sweep."""

from __future__ import annotations

import os
import re

import posix_ipc
import pytest

from shm import segment
from shm.segment import Segment, ShmSpaceError, check_shm_space, sweep_stale, unique_name
from tests.shm.conftest import entries_of


def _free() -> int:
    stat = os.statvfs("/dev/shm")
    return stat.f_bavail * stat.f_frsize


def test_unique_name_names_prefix_pid_and_a_random_part():
    name = unique_name("ringserve")
    assert re.fullmatch(rf"/ringserve-{os.getpid()}-[0-9a-f]{{12}}", name)
    assert unique_name() != unique_name()
    with pytest.raises(ValueError, match="prefix"):
        unique_name("a/b")
    with pytest.raises(ValueError, match="prefix"):
        unique_name("")


def test_create_attach_share_memory_and_unlink_is_idempotent(prefix):
    name = unique_name(prefix)
    created = Segment.create(name, 4096)
    attached = Segment.attach(name)
    assert attached.size == 4096
    created.buf[100:105] = b"hello"
    assert bytes(attached.buf[100:105]) == b"hello"
    assert entries_of(prefix) == [name[1:]]
    attached.unlink()
    created.unlink()
    assert entries_of(prefix) == []
    created.buf[0:1] = b"x"  # still mapped after the name is gone
    assert bytes(attached.buf[0:1]) == b"x"
    created.close()
    attached.close()


def test_create_refuses_an_existing_name_and_a_bad_size(prefix):
    name = unique_name(prefix)
    seg = Segment.create(name, 64)
    with pytest.raises(posix_ipc.ExistentialError):
        Segment.create(name, 64)
    with pytest.raises(ValueError, match="size must be positive"):
        Segment.create(unique_name(prefix), 0)
    seg.unlink()
    seg.close()


def test_attach_to_a_missing_segment_says_why(prefix):
    with pytest.raises(FileNotFoundError, match=r"does not exist: its creator exited, or every peer"):
        Segment.attach(unique_name(prefix))


def test_close_with_a_live_view_keeps_the_memory_until_the_view_goes(prefix):
    seg = Segment.create(unique_name(prefix), 64)
    seg.unlink()
    view = seg.buf[0:8]
    seg.close()
    view[0:2] = b"ok"  # the mapping outlives close() while a view holds it
    assert bytes(view[0:2]) == b"ok"
    view.release()


def test_free_space_check_names_need_free_and_remedy():
    free = _free()
    check_shm_space(min(free, 1 << 20))
    need = free + (1 << 30)
    with pytest.raises(ShmSpaceError) as err:
        check_shm_space(need)
    message = str(err.value)
    assert f"({need} bytes) are needed in /dev/shm" in message
    assert "are free" in message and "--shm-size" in message and "--ipc=host" in message


def test_create_checks_space_before_it_makes_anything(prefix):
    with pytest.raises(ShmSpaceError, match="--shm-size"):
        Segment.create(unique_name(prefix), _free() + (1 << 30))
    assert entries_of(prefix) == []


def test_sweep_keeps_live_creators_and_foreign_names(prefix, monkeypatch):
    live = Segment.create(unique_name(prefix), 64)
    dead = f"/{prefix}-999999999-abcdef012345"
    Segment.create(dead, 64).close()
    sem = posix_ipc.Semaphore(dead + "-r0", posix_ipc.O_CREX)
    sem.close()
    foreign = f"/{prefix}x-999999999-abcdef012345"  # another prefix: not ours to sweep
    Segment.create(foreign, 64).close()
    try:
        removed = sweep_stale(prefix, min_age_s=0)
        assert sorted(removed) == sorted([dead[1:], f"sem.{dead[1:]}-r0"])
        assert entries_of(prefix) == [live.name[1:]]
        assert sweep_stale(prefix, min_age_s=0) == []
    finally:
        segment.unlink_segment(foreign)
        live.unlink()
        live.close()
