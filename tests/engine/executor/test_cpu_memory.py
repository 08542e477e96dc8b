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
