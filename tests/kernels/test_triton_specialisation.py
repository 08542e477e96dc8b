"""Review F6: the attention kernels must not recompile mid-serving when the block table's width (eager
mode: ceil(longest sequence / block_size), different nearly every step) or the batch size changes. Triton
specialises integer arguments on == 1 and divisibility by 16 unless they are listed in do_not_specialize;
this launches both kernels with widths 1, 3 and 16 under tools.kernel_resources' compile-only sm_90 driver
(no GPU needed) and counts the compiled variants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = """
import json, torch
from tools.kernel_resources import _install_compile_only_driver
compiled = []
_install_compile_only_driver(compiled)
from kernels.triton_decode_attention import paged_decode_attention_triton
from kernels.triton_paged_attention import paged_attention_triton
query = torch.empty(8, 4, 16, dtype=torch.bfloat16)
cache = torch.empty(8, 16, 2, 16, dtype=torch.bfloat16)
for num_seqs, width in ((2, 1), (3, 3), (2, 16), (1, 5)):
    starts = torch.linspace(0, 8, num_seqs + 1).to(torch.int32)
    seq_lens = torch.full((num_seqs,), 40, dtype=torch.int32)
    tables = torch.zeros(num_seqs, width, dtype=torch.int32)
    paged_attention_triton(query, cache, cache, starts, seq_lens, tables, 0.1)
    paged_decode_attention_triton(query[:num_seqs], cache, cache, seq_lens, tables, 0.1, num_splits=2)
print(json.dumps({name: len({id(k) for n, k in compiled if n == name}) for name, _ in compiled}))
"""


def test_block_table_width_and_batch_size_compile_one_variant():
    triton = pytest.importorskip("triton")
    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
        pytest.skip("this triton build ships no NVIDIA toolchain")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    variants = json.loads(done.stdout.strip().splitlines()[-1])
    assert variants == {"_paged_attention_kernel": 1, "_decode_split_kernel": 1, "_decode_reduce_kernel": 1}
