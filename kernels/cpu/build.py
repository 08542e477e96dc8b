"""Building and loading the CPU kernels' library: the C sources beside this file compiled with the system's
C compiler on first use (in parallel, one line logged a file), linked into one shared library cached under
~/.cache/ringserve/kernels by a hash of the sources and flags, and loaded with ctypes.

`load()` is None, and callers take the torch paths, where the kernels cannot run: RINGSERVE_CPU_KERNELS=0,
a CPU without AVX2/FMA/F16C, no C compiler, or a failed build. The sources compile clean with -Wall -Wextra
(tests/kernels/cpu/test_build.py holds them to it). The library links libgomp by soname, so it shares
torch's OpenMP runtime (one thread pool) instead of starting a second one.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

_HERE = os.path.dirname(os.path.abspath(__file__))
# longest compile first (quant.c, one instance per block type and row count: ~4 s), so that the others
# share the remaining cores meanwhile and the build takes about as long as that one file
SOURCES = tuple(os.path.join(_HERE, name) for name in
                ("quant.c", "gemm.c", "attention.c", "elementwise.c", "quant_pack.c", "decode.c"))
HEADERS = tuple(os.path.join(_HERE, name) for name in ("kernels.h", "quant.h"))
WARNING_FLAGS = ("-Wall", "-Wextra")
COMPILE_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-fPIC", "-std=c11", *WARNING_FLAGS)
LINK_FLAGS = ("-fopenmp", "-shared", "-lm")
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
logger = logging.getLogger("ringserve.kernels")


def _cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "ringserve", "kernels")


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo; None where there is none to read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return None


def compiler() -> str | None:
    """The C compiler the build uses: $CC, else cc, else gcc; None if there is none."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build(cc: str) -> str:
    """The library's path, compiled first if this hash of sources and flags has not been built yet."""
    text = b""
    for path in (*HEADERS, *SOURCES):
        with open(path, "rb") as f:
            text += f.read()
    digest = hashlib.sha256(text + " ".join(COMPILE_FLAGS + LINK_FLAGS).encode()).hexdigest()[:16]
    target = os.path.join(_cache_dir(), f"cpu_kernels-{digest}.so")
    if os.path.isfile(target):
        return target
    os.makedirs(_cache_dir(), exist_ok=True)
    # A first start says what it is waiting for: one line per compiled file (the files compile in parallel).
    logger.info("building the CPU kernels (first use only; cached in %s): %d C files", _cache_dir(), len(SOURCES))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=_cache_dir()) as staging:
        objects = [os.path.join(staging, os.path.basename(source)[:-2] + ".o") for source in SOURCES]

        def compile_one(index: int) -> str:
            subprocess.run([cc, *COMPILE_FLAGS, "-c", SOURCES[index], "-o", objects[index]], check=True,
                           capture_output=True, timeout=120)
            return os.path.basename(SOURCES[index])

        with ThreadPoolExecutor(max_workers=max(1, min(len(SOURCES), os.cpu_count() or 1))) as pool:
            for done, name in enumerate(pool.map(compile_one, range(len(SOURCES))), 1):
                logger.info("  compiled %s (%d/%d)", name, done, len(SOURCES))
        library = os.path.join(staging, "cpu_kernels.so")
        subprocess.run([cc, *objects, *LINK_FLAGS, "-o", library], check=True, capture_output=True, timeout=120)
        os.replace(library, target)                  # atomic: concurrent builders all end with one file
    logger.info("built the CPU kernels in %.1f s", time.monotonic() - start)
    return target


def load() -> ctypes.CDLL | None:
    """The built library, or None where the kernels cannot run here (the callers' torch paths run)."""
    if os.environ.get("RINGSERVE_CPU_KERNELS", "1") == "0":
        return None
    if not all(flag in (cpu_flags() or ()) for flag in REQUIRED_CPU_FLAGS):
        return None
    cc = compiler()
    if cc is None:
        return None
    try:
        return ctypes.CDLL(build(cc))
    except (OSError, subprocess.SubprocessError):
        return None
