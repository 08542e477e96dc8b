"""The executor's malloc tuning (engine/executor/cpu_memory.py): after it, a large block freed and allocated
again reuses its pages instead of faulting fresh ones in. Run in a child process (it changes malloc for
the whole process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, resource, sys
from engine.executor.cpu_memory import reuse_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "tuned":
    assert reuse_freed_memory()
size = 16 << 20

def faults_of_one_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)              # touch every page, as a tensor kernel writing its output does
    libc.free(p)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults_of_one_step()
print(max(faults_of_one_step() for _ in range(3)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_reused_without_page_faults():
    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    assert faults("default") >= 1000           # 16 MiB of fresh pages each time: ~4,096 faults
    assert faults("tuned") < 100


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status")
def test_the_kv_cache_takes_memory_as_it_is_written():
    import torch

    from engine.executor.cpu_memory import zeroed_on_demand

    before = _rss()
    caches = zeroed_on_demand(4, (2, 1024, 16, 8, 64), torch.bfloat16)        # 4 x 32 MiB
    assert [(c.shape, c.dtype, c.is_contiguous()) for c in caches] == [((2, 1024, 16, 8, 64), torch.bfloat16, True)] * 4
    assert _rss() - before < (16 << 20)                                         # reserved, not resident
    caches[1][0, 3].fill_(1.5)                                                  # one 16 KiB block written
    assert float(caches[1][0, 3].sum()) == 1.5 * 16 * 8 * 64
    assert float(caches[1].sum()) == float(caches[1][0, 3].sum()) and float(caches[0].sum()) == 0.0
    caches[3].fill_(2.0)                                                        # a whole layer: 32 MiB
    assert _rss() - before > (24 << 20)


def test_the_default_kv_cache_is_what_the_model_can_use_capped_by_a_share_of_free_memory(monkeypatch):
    from engine.executor import cpu_memory

    GiB = 1 << 30
    monkeypatch.setattr(cpu_memory, "available_memory", lambda: 20 * GiB)
    assert cpu_memory.default_kv_cache_bytes(usable=1 * GiB, one_sequence=GiB // 8, ranks=1) == \
        (1 * GiB, "what max_num_seqs x max_model_len tokens take")
    size, reason = cpu_memory.default_kv_cache_bytes(usable=48 * GiB, one_sequence=GiB // 8, ranks=1)
    assert size == 2 * GiB and "10% of the 20.0 GiB available" in reason
    assert cpu_memory.default_kv_cache_bytes(usable=48 * GiB, one_sequence=GiB // 8, ranks=4)[0] == GiB // 2
    size, reason = cpu_memory.default_kv_cache_bytes(usable=48 * GiB, one_sequence=3 * GiB, ranks=1)
    assert size == 3 * GiB and "one max_model_len sequence" in reason
    monkeypatch.setattr(cpu_memory, "available_memory", lambda: None)
    assert cpu_memory.default_kv_cache_bytes(usable=48 * GiB, one_sequence=GiB, ranks=1)[0] == 4 * GiB


def test_available_memory_reads_meminfo():
    from engine.executor.cpu_memory import available_memory

    found = available_memory()
    assert found is None or 0 < found < (1 << 50)
