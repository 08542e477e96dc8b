"""kernels/cpu/quant (GGUF-quantized weights times float32 activations) against the float reference of the same
blocks, for every type with a kernel, on the AVX2 path and (where the CPU has it) the AVX-512 VNNI path, over
shapes with row, column and block tails; and kernels/gguf_blocks' reading of the blocks against the gguf
package's own dequantization.

The kernels round each activation to 8 bits per block (32 values for the legacy types, 256 for the k-quants)
before integer dot products, so they differ from dequantize-then-matmul by at most sum |w| * dx / 2 per output
(dx the block's step, max|x| / 127): the tests hold them to that bound, which a wrong scale, code or offset
anywhere exceeds by far."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.cpu import quant as cpu_quant
from kernels import gguf_blocks
from kernels.gguf_blocks import QUANT_TYPES, TYPE_IDS, QuantizedWeight, dequantize, unpack

needs_kernels = pytest.mark.skipif(not cpu_quant.available(), reason="needs x86 AVX2/FMA/F16C and a C compiler")
ISAS = [False] + ([True] if cpu_quant.available() and cpu_quant.vnni_possible() else [])
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]


def random_blocks(name: str, rows: int, k: int, seed: int) -> torch.Tensor:
    return gguf_blocks.random_blocks(TYPE_IDS[name], rows, k, seed)


def _error_bound(x: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    """The most that rounding x to 8 bits per block can move x @ weightᵀ, plus float32 summation slack."""
    m, k = x.shape
    step = x.abs().reshape(m, k // block, block).amax(-1) / 127
    half_steps = step.repeat_interleave(block, dim=1) / 2                      # [M, K]
    return half_steps @ weight.abs().T + 1e-5 * (x.abs() @ weight.abs().T) + 1e-6


@pytest.fixture(params=ISAS, ids=lambda on: "vnni" if on else "avx2")
def isa(request):
    was = cpu_quant.set_vnni(request.param)
    yield request.param
    cpu_quant.set_vnni(was)


@pytest.mark.parametrize("name", LEGACY + K_QUANTS)
def test_blocks_read_as_the_gguf_package_dequantizes_them(name):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    k = 512
    raw = random_blocks(name, 3, k, seed=1)
    expected = gguf_dequantize(raw.numpy(), GGMLQuantizationType(TYPE_IDS[name]))
    assert torch.equal(dequantize(raw, TYPE_IDS[name], k), torch.from_numpy(np.asarray(expected, np.float32)))
    codes, _, _, group = unpack(raw, TYPE_IDS[name], k)
    assert codes.dtype == torch.uint8 and group in (16, 32)


@needs_kernels
@pytest.mark.parametrize("name", LEGACY + K_QUANTS)
@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 7), (2, 130), (3, 5), (5, 64), (6, 16), (7, 3), (8, 33),
                                      (17, 9), (23, 18)])
def test_gemm_q_matches_the_float_matmul_of_the_same_blocks(isa, name, m, n):
    type_id = TYPE_IDS[name]
    block = QUANT_TYPES[type_id][1]
    for k in ((32, 96, 576) if block == 32 else (256, 768)):       # 1 and 3 legacy blocks: odd block counts
        raw = random_blocks(name, n, k, seed=m * 100 + n + k)
        weight = cpu_quant.PackedWeight(QuantizedWeight([(type_id, raw)], k))
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m))
        reference = dequantize(raw, type_id, k).double()
        expected = x.double() @ reference.T
        got = cpu_quant.gemm_q(x, weight)
        assert got.shape == (m, n) and got.dtype == torch.float32
        bound = _error_bound(x.double(), reference, block)
        assert ((got.double() - expected).abs() <= bound).all(), (k, (got.double() - expected).abs().max().item())


@needs_kernels
@pytest.mark.parametrize("name", ["Q4_1", "Q6_K"])
def test_a_row_gets_the_same_bits_in_any_batch(isa, name):
    """A pass takes up to 8 rows (AVX2: 4), each row count its own instance: a row's sums must not depend on
    how many rows share its pass, or speculative decoding's verify rows would not equal the decode steps
    they stand for (greedy outputs would drift at near-ties)."""
    k = 768
    raw = random_blocks(name, 40, k, seed=9)
    weight = cpu_quant.PackedWeight(QuantizedWeight([(TYPE_IDS[name], raw)], k))
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(9))
    whole = cpu_quant.gemm_q(x, weight)
    for rows in (1, 2, 3, 5, 7, 8, 9):
        for start in range(0, 13, rows):
            assert torch.equal(cpu_quant.gemm_q(x[start:start + rows].contiguous(), weight),
                               whole[start:start + rows]), (rows, start)


@needs_kernels
def test_gemm_q_error_is_the_activation_rounding_not_more(isa):
    """The bound is loose for one output but the mean error is ~1/sqrt(K) of it: a kernel that dropped the
    activation's per-block scale or a block's offset would sit at the bound or above everywhere."""
    k, name = 1536, "Q4_1"
    raw = random_blocks(name, 256, k, seed=5)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(5))
    reference = dequantize(raw, TYPE_IDS[name], k).double()
    weight = cpu_quant.PackedWeight(QuantizedWeight([(TYPE_IDS[name], raw)], k))
    err = (cpu_quant.gemm_q(x, weight).double() - x.double() @ reference.T).abs()
    assert err.mean() < 0.1 * _error_bound(x.double(), reference, 32).mean()


@needs_kernels
@pytest.mark.parametrize("threads", [1, 3, 64])
def test_mixed_parts_and_prefill_chunks_cover_every_output(isa, threads):
    """A fused weight whose parts differ in type and block family (q/k in a legacy type, v in a k-quant, as
    Q4_K_M files mix them), more activation rows than one chunk, any thread count: every output written."""
    k = 512
    names = ["Q5_0", "Q8_0", "Q6_K", "Q4_K"]
    parts = [(TYPE_IDS[name], random_blocks(name, rows, k, seed=rows)) for name, rows in zip(names, (9, 4, 6, 3))]
    weight = QuantizedWeight(parts, k)
    packed = cpu_quant.PackedWeight(weight)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(1))
    out = torch.full((300, weight.out_features), float("nan"))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_quant.gemm_q(x, packed, out)
    finally:
        torch.set_num_threads(previous)
    reference = weight.dequantize().double()
    bound = torch.cat([_error_bound(x.double(), dequantize(raw, t, k).double(), QUANT_TYPES[t][1])
                       for t, raw in parts], dim=1)
    assert ((out.double() - x.double() @ reference.T).abs() <= bound).all()


@needs_kernels
@pytest.mark.parametrize("name", LEGACY + K_QUANTS)
def test_packed_rows_read_as_the_reference(name):
    """The embedding lookup reads rows of the repacked tiles (row 17: the second tile, past its padding)."""
    k = 512
    raw = random_blocks(name, 18, k, seed=3)
    weight = cpu_quant.PackedWeight(QuantizedWeight([(TYPE_IDS[name], raw)], k))
    rows = torch.tensor([17, 0, 3, 3, 16])
    torch.testing.assert_close(weight.rows(rows), dequantize(raw, TYPE_IDS[name], k)[rows], rtol=1e-6, atol=1e-7)


def test_quantized_weight_refuses_blocks_that_do_not_fit():
    raw = random_blocks("Q4_0", 2, 64, seed=0)
    with pytest.raises(ValueError, match="take 18 bytes, not 36"):
        QuantizedWeight([(TYPE_IDS["Q4_0"], raw)], 32)
    with pytest.raises(ValueError, match="no quantized kernel"):
        QuantizedWeight([(10, raw)], 64)
    with pytest.raises(ValueError, match="multiples of 256"):
        QuantizedWeight([(TYPE_IDS["Q4_K"], raw)], 64)


@needs_kernels
@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_precise_activations_leave_a_hundredth_of_the_rounding(isa, name):
    """precise=True: the activations' rounding error quantized again as a second plane (the LM head's
    mode); what remains is about 1/254 of the one-plane rounding."""
    k = 512
    raw = random_blocks(name, 33, k, seed=9)
    weight = cpu_quant.PackedWeight(QuantizedWeight([(TYPE_IDS[name], raw)], k))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(9)) * torch.linspace(0.1, 10, k)
    reference = dequantize(raw, TYPE_IDS[name], k).double()
    expected = x.double() @ reference.T
    bound = _error_bound(x.double(), reference, QUANT_TYPES[TYPE_IDS[name]][1])
    err = (cpu_quant.gemm_q(x, weight, precise=True).double() - expected).abs()
    assert (err <= bound / 50 + 1e-4 * (x.double().abs() @ reference.abs().T)).all()
