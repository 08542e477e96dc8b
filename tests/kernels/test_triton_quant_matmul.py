"""The Triton dequantize-in-the-GEMM kernel against kernels/gguf_blocks.quant_matmul_torch (dequantize, then
matmul) for every type with a kernel, decode- and prefill-sized inputs, several parts of different types in
one weight (under Triton's interpreter on the CPU; tools/bench_quant_gpu.py runs real shapes on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernels.gguf_blocks import QUANT_TYPES, TYPE_IDS, QuantizedWeight, quant_matmul_torch
from kernels.triton_quant_matmul import TritonQuantWeight, quant_matmul_triton
from tests.kernels.tolerances import assert_close
from tests.kernels.cpu.test_quant import random_blocks

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)


@pytest.mark.parametrize("name", [name for name, _, _ in QUANT_TYPES.values()])
@pytest.mark.parametrize("m", [1, 20])
def test_triton_quant_matmul_matches_the_reference(name, m):
    k = 256 if QUANT_TYPES[TYPE_IDS[name]][1] == 256 else 96          # 96: a K that only 32-value steps divide
    weight = QuantizedWeight([(TYPE_IDS[name], random_blocks(name, 40, k, seed=m))], k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = quant_matmul_triton(x, TritonQuantWeight(weight, torch.device("cpu")))
    torch.testing.assert_close(got, quant_matmul_torch(x, weight), atol=1e-4, rtol=1e-4)


def test_parts_of_different_types_fill_their_columns():
    k = 256
    parts = [(TYPE_IDS[name], random_blocks(name, rows, k, seed=rows)) for name, rows in
             (("Q5_0", 24), ("Q6_K", 8), ("Q4_1", 3))]
    weight = QuantizedWeight(parts, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    gpu_form = TritonQuantWeight(weight, torch.device("cpu"))
    torch.testing.assert_close(gpu_form.matmul(x), quant_matmul_torch(x, weight), atol=1e-4, rtol=1e-4)
    ids = torch.tensor([2, 0, 2])
    one = QuantizedWeight(parts[:1], k)
    torch.testing.assert_close(TritonQuantWeight(one, torch.device("cpu")).rows(ids), one.rows(ids))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_activations_multiply_the_weight_rounded_to_their_dtype(dtype):
    """A W4A16 GEMM: the dequantized tile is rounded to x's dtype before the product (as a 16-bit matmul of
    the dequantized weight would be), accumulated in fp32, the result rounded to x's dtype."""
    k, name = 256, "Q4_K"
    weight = QuantizedWeight([(TYPE_IDS[name], random_blocks(name, 32, k, seed=7))], k)
    x = torch.randn(17, k, generator=torch.Generator().manual_seed(7)).to(dtype)
    tile = weight.dequantize()
    if dtype == torch.bfloat16:      # the interpreter's fp32 -> bf16 cast truncates (tests/kernels/tolerances.py)
        tile = (tile.view(torch.int32) & -65536).view(torch.float32)
    expected = (x.float() @ tile.to(dtype).float().T).to(dtype)
    got = quant_matmul_triton(x, TritonQuantWeight(weight, torch.device("cpu")))
    assert got.dtype == dtype
    assert_close(got, expected)
