"""kernels/__init__.py dispatch: CPU tensors go to the torch references without importing Triton; when
use_triton says yes, every dispatcher hands its arguments, in order, to the Triton kernel."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

import kernels
from kernels.rotary import rope_cos_sin_cache
from tests.conftest import REPO
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.tolerances import assert_close


def test_cpu_tensors_use_references_and_never_import_triton():
    script = (
        "import sys, torch, kernels\n"
        "x = torch.randn(2, 3, 32)\n"
        "kernels.rms_norm(x, torch.ones(32), 1e-6, x)\n"
        "kernels.silu_and_mul(x)\n"
        "kernels.rotary_embedding(torch.zeros(2, dtype=torch.long), x, x, kernels.rope_cos_sin_cache(32, 4, 1e4))\n"
        "cache = torch.zeros(2, 16, 3, 32)\n"
        "kernels.write_kv_cache(x, x, cache, cache, torch.tensor([0, 1]))\n"
        "kernels.paged_attention(x, cache, cache, torch.tensor([0, 2], dtype=torch.int32),\n"
        "                        torch.tensor([2], dtype=torch.int32), torch.tensor([[0]], dtype=torch.int32), 1.0)\n"
        "kernels.paged_decode_attention(x, cache, cache, torch.tensor([1, 2], dtype=torch.int32),\n"
        "                               torch.tensor([[0], [1]], dtype=torch.int32), 1.0)\n"
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('kernels.triton')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


TRITON_FUNCTIONS = {
    "kernels.triton_rms_norm": "rms_norm_triton",
    "kernels.triton_activation": "silu_and_mul_triton",
    "kernels.triton_rotary": "rotary_embedding_triton",
    "kernels.triton_kv_cache": "write_kv_cache_triton",
    "kernels.triton_paged_attention": "paged_attention_triton",
    "kernels.triton_decode_attention": "paged_decode_attention_triton",
}


@pytest.fixture
def triton_calls(monkeypatch) -> list[str]:
    """Route CPU tensors to the Triton kernels (they run under the interpreter here) and record which
    Triton functions the dispatchers called."""
    monkeypatch.setattr(kernels, "use_triton", lambda tensor: True)
    calls: list[str] = []
    for module_name, function_name in TRITON_FUNCTIONS.items():
        module = importlib.import_module(module_name)
        original = getattr(module, function_name)

        def spy(*args, _original=original, _name=function_name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, function_name, spy)
    return calls


@pytest.mark.interpreter
def test_elementwise_dispatchers_reach_triton(triton_calls):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 64, generator=gen)
    weight = torch.randn(64, generator=gen)
    residual = torch.randn(3, 64, generator=gen)
    for got, want in zip(kernels.rms_norm(x, weight, 1e-6, residual),
                         kernels.rms_norm_torch(x, weight, 1e-6, residual), strict=True):
        assert_close(got, want)
    assert_close(kernels.silu_and_mul(x), kernels.silu_and_mul_torch(x))
    query, key = torch.randn(3, 2, 32, generator=gen), torch.randn(3, 1, 32, generator=gen)
    positions = torch.tensor([0, 5, 9])
    table = rope_cos_sin_cache(32, 16, 1e4)
    for got, want in zip(kernels.rotary_embedding(positions, query, key, table),
                         kernels.rotary_embedding_torch(positions, query, key, table), strict=True):
        assert_close(got, want)
    assert triton_calls == ["rms_norm_triton", "silu_and_mul_triton", "rotary_embedding_triton"]


@pytest.mark.interpreter
def test_cache_and_attention_dispatchers_reach_triton(triton_calls):
    batch = make_paged_batch([1, 6], [20, 3], num_heads=2, num_kv_heads=1, head_dim=32)
    caches = batch.kv_cache
    kernels.write_kv_cache(batch.key, batch.value, caches[0], caches[1], batch.slot_mapping)
    batch.write_new_tokens()
    assert torch.equal(caches, batch.kv_cache)
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, batch.scale)
    assert_close(kernels.paged_attention(*args), kernels.paged_attention_torch(*args))
    decode_args = (batch.query[:1], batch.key_cache, batch.value_cache, batch.seq_lens[:1],
                   batch.block_tables[:1], batch.scale)
    assert_close(kernels.paged_decode_attention(*decode_args), kernels.paged_decode_attention_torch(*decode_args))
    assert triton_calls == ["write_kv_cache_triton", "paged_attention_triton", "paged_decode_attention_triton"]
