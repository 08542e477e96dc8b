"""rotary_embedding_triton against rotary_embedding_torch (under Triton's interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.rotary import rope_cos_sin_cache, rotary_embedding_torch
from kernels.triton_rotary import rotary_embedding_triton
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    "dtype,head_dim,num_heads,num_kv_heads,scaling",
    [
        (torch.float32, 32, 4, 2, None),
        (torch.bfloat16, 64, 6, 2, LLAMA3_SCALING),      # 6 heads: a head block with masked rows
        (torch.float16, 128, 4, 1, LLAMA3_SCALING),
    ],
)
def test_rotary_matches_reference_on_qkv_views(dtype, head_dim, num_heads, num_kv_heads, scaling):
    gen = torch.Generator().manual_seed(4)
    num_tokens = 9
    cache = rope_cos_sin_cache(head_dim, 512, 10000.0, scaling)
    # query and key as strided views into one fused qkv projection, as the model hands them over
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen).to(dtype)
    query, key = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    positions = torch.randint(0, 512, (num_tokens,), generator=gen)
    before = qkv.clone()
    rotated_q, rotated_k = rotary_embedding_triton(positions, query, key, cache)
    ref_q, ref_k = rotary_embedding_torch(positions, query, key, cache)
    assert_close(rotated_q, ref_q)
    assert_close(rotated_k, ref_k)
    assert torch.equal(qkv, before)                       # new tensors, inputs untouched


def test_position_zero_is_identity():
    query = torch.randn(1, 2, 32)
    key = torch.randn(1, 1, 32)
    rotated_q, rotated_k = rotary_embedding_triton(torch.zeros(1, dtype=torch.long), query, key,
                                                   rope_cos_sin_cache(32, 8, 10000.0))
    torch.testing.assert_close(rotated_q, query)
    torch.testing.assert_close(rotated_k, key)


def test_table_of_another_head_dim_is_rejected():
    with pytest.raises(ValueError, match="head_dim"):
        rotary_embedding_triton(torch.zeros(2, dtype=torch.long), torch.randn(2, 2, 64), torch.randn(2, 1, 64),
                                rope_cos_sin_cache(32, 8, 10000.0))
