"""The executor's memory on the CPU: its heap policy, and the default size and allocation of the KV cache.

Heap: reuse freed activation memory instead of page-faulting fresh memory in.

glibc serves allocations above its mmap threshold (128 KiB at first, raised as such blocks are freed) with
fresh mmap()s and returns them on free, so each step's large activation tensors (a 2,048-token prefill of a
small model holds several of 10-25 MB) are faulted in page by page every time: on the 2-core Zen 4 machine
about a third of such a prefill's time (2.4 s -> 1.7 s with this). The standard fix for CPU inference is a
caching allocator (jemalloc/tcmalloc preloaded); without changing the process's allocator, mallopt gets
most of it: blocks up to 32 MiB (glibc's maximum) come from the heap, and up to TRIM_KEEP bytes of freed
heap stay mapped for the next step.

KV cache: without --kv-cache-memory it is sized from what the model can use (max_num_seqs sequences of
max_model_len tokens), capped by a share of the memory still available once the weights are in (never below
one full-length sequence), rather than a fixed 4 GiB that took 5 GB of resident memory for a 135M model.
It lives in one anonymous mapping, whose pages the kernel hands out zeroed as they are first written: the
cache takes memory as it fills, and a start does not spend seconds writing gigabytes of zeros.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import sys

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # <malloc.h>
MMAP_THRESHOLD = 32 << 20                         # glibc's upper bound for it on 64-bit
TRIM_KEEP = 512 << 20
KV_SHARE_OF_AVAILABLE = 0.1                       # of the memory available when the cache is sized
KV_BYTES_IF_UNKNOWN = 4 << 30                     # where /proc/meminfo cannot be read


def reuse_freed_memory() -> bool:
    """Tune glibc's malloc as above; False (and nothing changed) where it is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_KEEP))


def release_freed_memory(device: torch.device) -> None:
    """Hand memory freed by a sleeping engine back to the system: a GPU's cached blocks, and on the CPU the
    heap glibc keeps mapped (reuse_freed_memory asks it to keep up to TRIM_KEEP bytes)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def available_memory() -> int | None:
    """Bytes the system can still give: /proc/meminfo's MemAvailable, lowered by a cgroup v2 memory limit
    (a container's) when that is tighter; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                found.append(max(int(limit) - int(f.read()), 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def default_kv_cache_bytes(usable: int, one_sequence: int, ranks: int) -> tuple[int, str]:
    """The KV bytes one of `ranks` executors sharing this machine gets by default, and why: `usable` (what
    max_num_seqs full-length sequences take) capped by its share of the available memory, but at least
    `one_sequence`."""
    available = available_memory()
    cap = KV_BYTES_IF_UNKNOWN if available is None else int(KV_SHARE_OF_AVAILABLE * available / ranks)
    size = min(usable, max(cap, one_sequence))
    if size == usable:
        reason = "what max_num_seqs x max_model_len tokens take"
    elif size == one_sequence:
        reason = "one max_model_len sequence, more than the share of free memory"
    elif available is None:
        reason = f"{_gib(KV_BYTES_IF_UNKNOWN)}: the available memory is unknown"
    else:
        reason = (f"{KV_SHARE_OF_AVAILABLE:.0%} of the {_gib(available)} available"
                  + (f", over {ranks} executors" if ranks > 1 else "")
                  + f"; max_num_seqs x max_model_len tokens would take {_gib(usable)}")
    return size, reason


def zeroed_on_demand(count: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """`count` zero tensors of `shape` in one anonymous mapping: each page is zero-filled by the kernel when
    it is first touched, so memory is taken as the tensors are written (torch.zeros writes every page at
    once). The tensors keep the mapping alive."""
    each = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    region = torch.frombuffer(mmap.mmap(-1, max(count * each, 1)), dtype=torch.uint8)
    return [region[i * each:(i + 1) * each].view(dtype).view(shape) for i in range(count)]


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"
