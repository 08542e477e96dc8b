"""Compile every Triton kernel for an H100 (sm_90) on any machine, GPU or not, and print its resources.

    python -m tools.kernel_resources            # (TRITON_INTERPRET must be unset)

The kernels are launched through their real Python wrappers with CPU tensors of real model shapes, but
Triton is handed a stand-in driver that reports an sm_90 target and every launch is turned into a
compile-only warm-up, so what is compiled is exactly what those calls would run. For each kernel the
cubin's registers per thread, shared memory and local memory (register spills) are read with the
cuobjdump that ships with Triton. Exit status 1 when a kernel fails to compile or spills.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TARGET_ARCH = 90


def _install_compile_only_driver(compiled: list) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class CompileOnlyDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", TARGET_ARCH, 32)

    driver.set_active(CompileOnlyDriver())
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    JITFunction.run = compile_only
    assert triton.__version__


def _cases():
    """(label, thunk) pairs: Llama-3-8B shapes (32 query heads, 8 KV heads, head_dim 128) in bf16,
    plus the other dtypes, head dims and GQA groups the kernels specialise on."""
    from kernels.rotary import rope_cos_sin_cache
    from kernels.triton_activation import silu_and_mul_triton
    from kernels.triton_decode_attention import paged_decode_attention_triton
    from kernels.triton_kv_cache import write_kv_cache_triton
    from kernels.triton_paged_attention import paged_attention_triton
    from kernels.triton_rms_norm import rms_norm_triton
    from kernels.triton_rotary import rotary_embedding_triton

    bf16 = torch.bfloat16

    def paged(dtype, heads, kv_heads, head_dim, num_tokens, num_seqs):
        query = torch.empty(num_tokens, heads, head_dim, dtype=dtype)
        cache = torch.empty(64, 16, kv_heads, head_dim, dtype=dtype)
        starts = torch.linspace(0, num_tokens, num_seqs + 1).to(torch.int32)
        seq_lens = torch.full((num_seqs,), 512, dtype=torch.int32)
        tables = torch.zeros(num_seqs, 32, dtype=torch.int32)
        return query, cache, starts, seq_lens, tables

    def mixed(dtype, heads, kv_heads, head_dim, num_tokens, num_seqs):
        query, cache, starts, seq_lens, tables = paged(dtype, heads, kv_heads, head_dim, num_tokens, num_seqs)
        return lambda: paged_attention_triton(query, cache, cache, starts, seq_lens, tables, 0.1)

    def decode(dtype, heads, kv_heads, head_dim, num_seqs, num_splits=16):
        query, cache, _, seq_lens, tables = paged(dtype, heads, kv_heads, head_dim, num_seqs, num_seqs)
        return lambda: paged_decode_attention_triton(query, cache, cache, seq_lens, tables, 0.1,
                                                     num_splits=num_splits)

    hidden = torch.empty(8, 4096, dtype=bf16)
    weight = torch.empty(4096, dtype=bf16)
    qkv = torch.empty(8, 48, 128, dtype=bf16)
    cache = torch.empty(64, 16, 8, 128, dtype=bf16)
    return [
        ("rms_norm bf16 4096 +residual", lambda: rms_norm_triton(hidden, weight, 1e-5, hidden)),
        ("rms_norm bf16 4096", lambda: rms_norm_triton(hidden, weight, 1e-5)),
        ("silu_and_mul bf16 14336", lambda: silu_and_mul_triton(torch.empty(8, 2 * 14336, dtype=bf16))),
        ("rotary bf16 32/8x128", lambda: rotary_embedding_triton(
            torch.zeros(8, dtype=torch.long), qkv[:, :32], qkv[:, 32:40], rope_cos_sin_cache(128, 64, 5e5))),
        ("write_kv_cache bf16 8x128", lambda: write_kv_cache_triton(
            qkv[:, 32:40], qkv[:, 40:], cache, cache, torch.zeros(8, dtype=torch.long))),
        ("write_kv_cache bf16 1x128", lambda: write_kv_cache_triton(
            qkv[:, 32:33], qkv[:, 40:41], cache[:, :, :1], cache[:, :, :1], torch.zeros(8, dtype=torch.long))),
        ("paged_attention bf16 32/8x128 prefill", mixed(bf16, 32, 8, 128, 1024, 4)),
        ("paged_attention bf16 32/8x128 decode-heavy", mixed(bf16, 32, 8, 128, 40, 32)),
        ("paged_attention bf16 28/4x128 (group 7)", mixed(bf16, 28, 4, 128, 1024, 4)),
        ("paged_attention fp16 16/16x64", mixed(torch.float16, 16, 16, 64, 1024, 4)),
        ("paged_attention fp32 32/8x128", mixed(torch.float32, 32, 8, 128, 1024, 4)),
        ("paged_attention bf16 16/16x256", mixed(bf16, 16, 16, 256, 1024, 4)),
        ("paged_attention bf16 8/1x64, one request", mixed(bf16, 8, 1, 64, 300, 1)),
        ("paged_decode_attention bf16 32/8x128", decode(bf16, 32, 8, 128, 64)),
        ("paged_decode_attention bf16 64/8x128", decode(bf16, 64, 8, 128, 64)),
        ("paged_decode_attention fp32 32/8x128", decode(torch.float32, 32, 8, 128, 64)),
        ("paged_decode_attention bf16 16/16x256", decode(bf16, 16, 16, 256, 64)),
        ("paged_decode_attention bf16 32/8x128 1 split", decode(bf16, 32, 8, 128, 256, num_splits=1)),
        ("paged_attention fp32 4/2x16 (demo model)", mixed(torch.float32, 4, 2, 16, 256, 4)),
        ("paged_decode_attention fp32 4/2x16 (demo)", decode(torch.float32, 4, 2, 16, 8)),
        ("paged_attention bf16 4/2x16 (tiny tests)", mixed(bf16, 4, 2, 16, 256, 4)),
    ]


def _resources(cubin: bytes) -> dict[str, int]:
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True,
                                text=True, check=True).stdout
    line = next(x for x in report.splitlines() if "REG:" in x)
    return {key: int(value) for key, value in re.findall(r"(REG|SHARED|LOCAL|STACK):(\d+)", line)}


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter compiles nothing", file=sys.stderr)
        return 2
    compiled: list = []
    _install_compile_only_driver(compiled)
    failures = 0
    print(f"{'case':44} {'kernel':24} {'regs':>5} {'smem KiB':>9} {'spill B':>8}")
    for label, call in _cases():
        del compiled[:]
        try:
            call()
        except Exception as error:  # report every failing case, then fail
            print(f"{label:44} COMPILE FAILED: {type(error).__name__}: {error}")
            failures += 1
            continue
        for name, kernel in compiled:
            usage = _resources(kernel.asm["cubin"])
            shared = max(kernel.metadata.shared, usage["SHARED"]) / 1024
            spill = usage["LOCAL"] + usage["STACK"]
            failures += spill > 0
            print(f"{label:44} {name:24} {usage['REG']:>5} {shared:>9.1f} {spill:>8}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
