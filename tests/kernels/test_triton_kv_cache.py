"""write_kv_cache_triton against write_kv_cache_torch (under Triton's interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_cache import write_kv_cache_torch
from kernels.triton_kv_cache import write_kv_cache_triton

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)


@pytest.mark.parametrize(
    "block_size,num_kv_heads,head_dim,src_dtype,cache_dtype",
    [
        (16, 2, 32, torch.float32, torch.float32),
        (8, 3, 64, torch.bfloat16, torch.bfloat16),       # 3 heads: masked rows in the head block
        (16, 1, 128, torch.float32, torch.float16),       # written with a dtype conversion
    ],
)
def test_write_matches_reference_and_skips_padding(block_size, num_kv_heads, head_dim, src_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(5)
    num_blocks = 6
    # slots in several blocks, crossing a block boundary, with padding (-1) in between
    slot_mapping = torch.tensor([3, block_size - 1, -1, block_size, 4 * block_size + 2, -1, 5 * block_size],
                                dtype=torch.int64)
    num_tokens = slot_mapping.shape[0]
    kv = torch.randn(num_tokens, 2 * num_kv_heads, head_dim, generator=gen).to(src_dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]    # strided views
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(cache_dtype)
    expected = cache.clone()
    write_kv_cache_torch(key, value, expected[0], expected[1], slot_mapping)
    write_kv_cache_triton(key, value, cache[0], cache[1], slot_mapping)
    assert torch.equal(cache, expected)


def test_all_padding_leaves_cache_untouched():
    cache = torch.randn(2, 2, 16, 1, 32)
    before = cache.clone()
    write_kv_cache_triton(torch.randn(3, 1, 32), torch.randn(3, 1, 32), cache[0], cache[1],
                          torch.full((3,), -1, dtype=torch.int64))
    assert torch.equal(cache, before)


def test_wrong_key_shape_is_rejected():
    cache = torch.zeros(2, 2, 16, 2, 32)
    with pytest.raises(ValueError, match="must be"):
        write_kv_cache_triton(torch.randn(3, 1, 32), torch.randn(3, 1, 32), cache[0], cache[1],
                              torch.zeros(3, dtype=torch.int64))
