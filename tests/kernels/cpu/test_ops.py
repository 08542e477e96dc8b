"""kernels/cpu/ops against the torch references: the 16-bit matmul and the paged decode attention, over
shapes that hit every code path (odd sizes, tails, grouped heads, shuffled block tables), and the engine
using them where they run. Skipped where the kernels cannot run (no AVX2/F16C or no C compiler)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from kernels import paged_decode_attention_torch
from kernels.cpu import ops as cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="needs x86 AVX2/FMA/F16C and a C compiler")
needs_bf16_dot = pytest.mark.skipif(not cpu_ops.bf16_dot_possible(), reason="needs a CPU with AVX-512 BF16")


@contextlib.contextmanager
def _torch_threads(count: int):
    """torch's (and so the kernels') thread count set to `count` for the block."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def float32_arithmetic():
    """gemm16 and the attention in float32 throughout, also on CPUs where bf16 weights and caches take the
    AVX-512 BF16 path."""
    was = cpu_ops.set_bf16_dot(False)
    yield
    cpu_ops.set_bf16_dot(was)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 64), (2, 96, 576), (3, 7, 40), (5, 13, 19), (16, 130, 72)])
def test_gemm16_matches_float32_matmul_of_the_same_weights(float32_arithmetic, dtype, m, n, k):
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=generator)
    weight = torch.randn(n, k, generator=generator).to(dtype)
    expected = F.linear(x, weight.float())
    got = cpu_ops.gemm16(x, weight)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    torch.testing.assert_close(got, expected, atol=1e-4 * k**0.5, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3, 7, 64, 100])
@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 5), (2, 23), (1, 1000), (2, 4099)])
def test_gemm16_one_or_two_rows_cover_every_weight_row_on_any_thread_count(float32_arithmetic, threads, m, n):
    """At one or two rows the weight rows are shared out by stealing (each thread owns a range, idle ones
    take from the back of the others'): every output row written, for more threads than rows, ranges shorter
    and longer than a steal, and thread counts above the kernel's cap of 64."""
    generator = torch.Generator().manual_seed(threads * 100 + n)
    x = torch.randn(m, 40, generator=generator)
    weight = torch.randn(n, 40, generator=generator).bfloat16()
    out = torch.full((m, n), float("nan"))
    with _torch_threads(threads):
        cpu_ops.gemm16(x, weight, out)
    torch.testing.assert_close(out, F.linear(x, weight.float()), atol=1e-4, rtol=1e-4)


@needs_bf16_dot
@pytest.mark.parametrize("threads", [1, 3, 64, 100])
@pytest.mark.parametrize(("m", "n"), [(3, 3), (5, 9), (17, 4099)])
def test_gemm16_avx512_tiles_cover_every_weight_row_on_any_thread_count(threads, m, n):
    """From three rows on (AVX-512 BF16) the four-row tiles are shared out the same way; the rows past the
    last whole tile come after."""
    generator = torch.Generator().manual_seed(threads * 100 + n)
    x = torch.randn(m, 40, generator=generator)
    weight = torch.randn(n, 40, generator=generator).bfloat16()
    out = torch.full((m, n), float("nan"))
    was = cpu_ops.set_bf16_dot(True)
    try:
        with _torch_threads(threads):
            cpu_ops.gemm16(x, weight, out)
    finally:
        cpu_ops.set_bf16_dot(was)
    torch.testing.assert_close(out, F.linear(x.bfloat16().float(), weight.float()), atol=1e-4, rtol=1e-4)


def test_gemm16_widens_16_bit_activations_first(float32_arithmetic):
    x = torch.randn(4, 48).bfloat16()
    weight = torch.randn(24, 48).bfloat16()
    torch.testing.assert_close(cpu_ops.gemm16(x, weight), F.linear(x.float(), weight.float()),
                               atol=1e-4, rtol=1e-4)


@needs_bf16_dot
@pytest.mark.parametrize(("m", "n", "k"), [(3, 7, 40), (5, 13, 19), (6, 4, 32), (16, 130, 72), (17, 1537, 576),
                                           (40, 9, 1000), (1, 64, 64), (2, 96, 576)])
def test_gemm16_bf16_dot_rounds_the_activations_to_bf16(m, n, k):
    """With AVX-512 BF16 from three rows on: the products of bf16-rounded activations and the bf16 weights,
    summed in float32 (tails of K past a multiple of 32 and of N past a multiple of 4 included); one and two
    rows stay float32 (bound by reading the weights, where the conversion would only cost). fp16 weights
    take the same AVX-512 tiles in float32 (each weight widened exactly): the float32 product."""
    generator = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=generator)
    weight = torch.randn(n, k, generator=generator).bfloat16()
    was = cpu_ops.set_bf16_dot(True)
    try:
        got = cpu_ops.gemm16(x, weight)
        fp16 = cpu_ops.gemm16(x, weight.half())          # fp16 weights: float32 arithmetic
    finally:
        cpu_ops.set_bf16_dot(was)
    activations = x.bfloat16().float() if m >= 3 else x
    torch.testing.assert_close(got, F.linear(activations, weight.float()), atol=1e-4 * k**0.5, rtol=1e-4)
    torch.testing.assert_close(fp16, F.linear(x.double(), weight.half().double()).float(), atol=1e-5 * k**0.5,
                               rtol=1e-5)
    if m >= 3:      # and it really is the rounded arithmetic, not float32's
        assert not torch.allclose(got, F.linear(x, weight.float()), atol=1e-5, rtol=1e-5)


def test_set_bf16_dot_refuses_a_cpu_without_it(float32_arithmetic, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(cpu_ops, "bf16_dot_possible", lambda: False)
        with pytest.raises(RuntimeError, match="AVX-512 BF16"):
            cpu_ops.set_bf16_dot(True)
    assert cpu_ops.set_bf16_dot(False) is False          # the refusal changed nothing


def test_gemm16_rejects_float32_weights():
    with pytest.raises(ValueError, match="bf16/fp16"):
        cpu_ops.gemm16(torch.randn(1, 8), torch.randn(8, 8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128), (10, 2, 40),
                                                                     (6, 2, 72)])
def test_paged_decode_attention16_matches_the_torch_reference(float32_arithmetic, dtype, num_heads, num_kv_heads,
                                                             head_dim):
    generator = torch.Generator().manual_seed(num_heads * 100 + head_dim)
    block_size, seq_lens = 4, torch.tensor([1, 5, 17, 33, 8], dtype=torch.int32)
    blocks_per_seq = -(-int(seq_lens.max()) // block_size)
    num_blocks = 1 + len(seq_lens) * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(dtype)
    # each request's blocks are scattered over the pool, as the block allocator leaves them
    block_tables = (1 + torch.randperm(num_blocks - 1, generator=generator)).view(len(seq_lens), -1).int()
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5
    expected = paged_decode_attention_torch(query.float(), key_cache.float(), value_cache.float(), seq_lens,
                                            block_tables, scale)
    got = cpu_ops.paged_decode_attention16(query, key_cache, value_cache, seq_lens, block_tables, scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)
    got32 = cpu_ops.paged_decode_attention16(query.float(), key_cache, value_cache, seq_lens, block_tables,
                                              scale)
    torch.testing.assert_close(got32, expected, atol=1e-5, rtol=1e-4)


@needs_bf16_dot
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128), (10, 2, 40)])
def test_paged_decode_attention16_on_avx512_matches_the_reference_for_an_f16_cache(num_heads, num_kv_heads, head_dim):
    """With the AVX-512 switch on, an f16 cache takes its own path (keys widened 16 at a time, float32
    products, the same arithmetic as the AVX2 path in another order; head_dim 40 stays on AVX2): float32
    accuracy, over ranges (long rows) and short rows."""
    generator = torch.Generator().manual_seed(num_heads * 10 + head_dim)
    block_size, seq_lens = 16, torch.tensor([1, 15, 17, 333, 70], dtype=torch.int32)
    blocks_per_seq = -(-int(seq_lens.max()) // block_size)
    num_blocks = 1 + len(seq_lens) * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).half()
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).half()
    block_tables = (1 + torch.randperm(num_blocks - 1, generator=generator)).view(len(seq_lens), -1).int()
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator)
    expected = paged_decode_attention_torch(query, key_cache.float(), value_cache.float(), seq_lens, block_tables,
                                            head_dim**-0.5)
    was = cpu_ops.set_bf16_dot(True)
    try:
        got = cpu_ops.paged_decode_attention16(query, key_cache, value_cache, seq_lens, block_tables, head_dim**-0.5)
    finally:
        cpu_ops.set_bf16_dot(was)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_supports_attention_names_the_layouts_it_cannot_take():
    cache16 = torch.zeros(2, 4, 2, 64, dtype=torch.bfloat16)
    assert cpu_ops.supports_attention(cache16, 6)
    assert not cpu_ops.supports_attention(cache16.float(), 6)              # fp32 cache: torch path
    assert not cpu_ops.supports_attention(cache16, 5)                      # heads not a multiple
    assert not cpu_ops.supports_attention(torch.zeros(2, 4, 2, 60, dtype=torch.bfloat16), 4)


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("seq_lens", [[333], [3, 400], [0, 130]])
def test_paged_decode_attention16_splits_the_keys(float32_arithmetic, seq_lens, batch_invariant):
    """Each request's keys are attended in ranges and merged (split-K): ranges of about 64 keys by the
    request's length (batch_invariant, decode), or as many as give two threads four tasks each (prefill
    rows; every case here splits); a request without keys gives zeros; the result is the reference's."""
    generator = torch.Generator().manual_seed(sum(seq_lens))
    block_size, num_heads, num_kv_heads, head_dim = 16, 4, 1, 64
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    blocks_per_seq = max(1, -(-int(seq_lens.max()) // block_size))
    num_blocks = 1 + len(seq_lens) * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).bfloat16()
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).bfloat16()
    block_tables = (1 + torch.randperm(num_blocks - 1, generator=generator)).view(len(seq_lens), -1).int()
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator)
    with _torch_threads(2):
        got = cpu_ops.paged_decode_attention16(query, key_cache, value_cache, seq_lens, block_tables, 0.125,
                                                batch_invariant)
    expected = paged_decode_attention_torch(query, key_cache.float(), value_cache.float(), seq_lens, block_tables,
                                            0.125)
    nonempty = seq_lens > 0
    torch.testing.assert_close(got[nonempty], expected[nonempty], atol=1e-5, rtol=1e-4)
    assert torch.equal(got[~nonempty], torch.zeros_like(got[~nonempty]))      # no keys: zeros, not NaN


@pytest.mark.parametrize("threads", [1, 2])
def test_paged_decode_attention16_gives_a_row_the_same_bits_in_any_batch(threads):
    """A row's key ranges follow its own length, not the batch's: alone or among others (a verify step's
    rows, a large batch) it gets the same bits, which keeps speculative decoding's greedy outputs exact."""
    generator = torch.Generator().manual_seed(threads)
    block_size, num_heads, num_kv_heads, head_dim = 16, 9, 3, 64
    seq_lens = torch.tensor([300, 301, 302, 303, 40, 700], dtype=torch.int32)
    key_cache = torch.randn(60, block_size, num_kv_heads, head_dim, generator=generator).half()
    value_cache = torch.randn(60, block_size, num_kv_heads, head_dim, generator=generator).half()
    block_tables = (1 + torch.arange(6 * 44) % 59).view(6, 44).int()
    query = torch.randn(6, num_heads, head_dim, generator=generator)
    with _torch_threads(threads):
        together = cpu_ops.paged_decode_attention16(query, key_cache, value_cache, seq_lens, block_tables, 0.125)
        for r in range(6):
            alone = cpu_ops.paged_decode_attention16(query[r:r + 1], key_cache, value_cache, seq_lens[r:r + 1],
                                                      block_tables[r:r + 1], 0.125)
            assert torch.equal(alone[0], together[r]), r


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention16_matches_the_reference_on_mixed_chunks(float32_arithmetic, dtype):
    """Prefill chunks (one after a cached prefix), decode tokens and padding rows in one batch: causal
    attention as the torch reference computes it."""
    from kernels import paged_attention_torch

    generator = torch.Generator().manual_seed(7)
    block_size, num_heads, num_kv_heads, head_dim = 4, 6, 2, 32
    query_lens, seq_lens = [5, 1, 9, 1], [5, 12, 20, 3]          # request 2: 11 cached + a chunk of 9
    blocks_per_seq = -(-max(seq_lens) // block_size)
    num_blocks = 1 + len(seq_lens) * blocks_per_seq
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=generator).to(dtype)
    block_tables = (1 + torch.randperm(num_blocks - 1, generator=generator)).view(len(seq_lens), -1).int()
    tokens = sum(query_lens)
    query = torch.randn(tokens + 2, num_heads, head_dim, generator=generator)      # two padding rows
    query_start_loc = torch.tensor([0, 5, 6, 15, 16], dtype=torch.int32)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = paged_attention_torch(query[:tokens], key_cache.float(), value_cache.float(), query_start_loc,
                                     seq_lens, block_tables, 0.2)
    got = cpu_ops.paged_attention16(query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, 0.2)
    torch.testing.assert_close(got[:tokens], expected, atol=1e-5, rtol=1e-4)
    assert torch.equal(got[tokens:], torch.zeros_like(got[tokens:]))


@needs_bf16_dot
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 96),
                                                                     (10, 2, 40)])
@pytest.mark.parametrize("seq_lens", [[1, 5, 17, 33, 8], [15, 16, 47], [300]])
def test_bf16_dot_attention_rounds_the_query_to_bf16(num_heads, num_kv_heads, head_dim, seq_lens):
    """On AVX-512 BF16 CPUs a bf16 cache is attended with the query rounded to bf16 (VDPBF16PS scores, 16 keys
    at a time, partial groups and split ranges included): the reference on the rounded query, to float32
    rounding; the fp16 cache and head sizes not a multiple of 32 keep the float32 path."""
    generator = torch.Generator().manual_seed(num_heads * 100 + head_dim + len(seq_lens))
    block_size, seq_lens = 16, torch.tensor(seq_lens, dtype=torch.int32)
    blocks_per_seq = -(-int(seq_lens.max()) // block_size)
    num_blocks = 1 + len(seq_lens) * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=generator).bfloat16()
    value_cache = torch.randn(shape, generator=generator).bfloat16()
    block_tables = (1 + torch.randperm(num_blocks - 1, generator=generator)).view(len(seq_lens), -1).int()
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator)
    scale = head_dim**-0.5
    was = cpu_ops.set_bf16_dot(True)
    try:
        got = cpu_ops.paged_decode_attention16(query, key_cache, value_cache, seq_lens, block_tables, scale)
        got_fp16 = cpu_ops.paged_decode_attention16(query, key_cache.half(), value_cache.half(), seq_lens,
                                                     block_tables, scale)
    finally:
        cpu_ops.set_bf16_dot(was)
    exact = paged_decode_attention_torch(query, key_cache.float(), value_cache.float(), seq_lens, block_tables, scale)
    if head_dim % 32 == 0:
        rounded = paged_decode_attention_torch(query.bfloat16().float(), key_cache.float(), value_cache.float(),
                                               seq_lens, block_tables, scale)
        torch.testing.assert_close(got, rounded, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(got, exact, atol=1e-6, rtol=1e-6)      # the bf16 path really ran
    else:
        torch.testing.assert_close(got, exact, atol=1e-5, rtol=1e-4)
    fp16_exact = paged_decode_attention_torch(query, key_cache.half().float(), value_cache.half().float(), seq_lens,
                                              block_tables, scale)
    torch.testing.assert_close(got_fp16, fp16_exact, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "n"), [(1, 576), (7, 40), (33, 19)])
def test_rms_norm_matches_the_reference_with_and_without_the_residual(weight_dtype, rows, n):
    """The eager path's RMSNorm (float32 rows, 16-bit weight, vector tails): kernels.rms_norm sends these to
    the C kernel, which computes the reference's float32 arithmetic."""
    import kernels
    from kernels import rms_norm_torch

    generator = torch.Generator().manual_seed(rows * n)
    x, residual = torch.randn(2, rows, n, generator=generator) * 3
    weight = (1 + 0.1 * torch.randn(n, generator=generator)).to(weight_dtype)
    assert cpu_ops.takes_rms_norm(x, weight, residual)
    got, total = kernels.rms_norm(x, weight, 1e-6, residual)
    expected, expected_total = rms_norm_torch(x, weight, 1e-6, residual)
    assert torch.equal(total, expected_total) and total.data_ptr() not in (x.data_ptr(), residual.data_ptr())
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(kernels.rms_norm(x, weight, 1e-6), rms_norm_torch(x, weight, 1e-6), atol=2e-6,
                               rtol=2e-6)
    assert not cpu_ops.takes_rms_norm(x.bfloat16(), weight, None)                  # 16-bit rows: torch
    assert not cpu_ops.takes_rms_norm(torch.zeros(rows, 2 * n)[:, ::2], weight, None)      # not contiguous
    with pytest.raises(ValueError, match="rms_norm"):
        cpu_ops.rms_norm(x[:, :-1].contiguous(), weight, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "width"), [(1, 3072), (5, 38), (17, 2)])
def test_silu_and_mul_matches_the_reference(dtype, rows, width):
    """float32 rows everywhere, bf16 ones (rounded after the SiLU and after the product, as torch's bf16
    ops round) where AVX-512 BF16 makes bf16 matmuls native."""
    import kernels
    from kernels import silu_and_mul_torch

    if dtype == torch.bfloat16 and not cpu_ops.bf16_dot_possible():
        assert not cpu_ops.takes_silu_and_mul(torch.zeros(2, 4, dtype=dtype))
        pytest.skip("bf16 rows take the C kernel only on a CPU with AVX-512 BF16")
    generator = torch.Generator().manual_seed(rows + width)
    x = (torch.randn(rows, width, generator=generator) * 4).to(dtype)
    assert cpu_ops.takes_silu_and_mul(x)
    got, expected = kernels.silu_and_mul(x), silu_and_mul_torch(x)
    assert got.dtype == dtype and got.shape == (rows, width // 2)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    else:           # the same bf16 value, or one step apart where the two exps straddle a rounding boundary
        torch.testing.assert_close(got.float(), expected.float(), atol=0, rtol=2**-7)
        assert (got != expected).float().mean() < 0.01
    assert not cpu_ops.takes_silu_and_mul(torch.zeros(3, 5))                     # odd width: torch


def test_rope_matches_the_reference_on_a_slice_of_the_fused_qkv():
    """The eager path rotates q and k inside the fused qkv output (rows wider than the heads): same products
    and sums as rotate_with_rows' torch ops, bit for bit."""
    from kernels.rotary import rope_cos_sin_cache, rope_rows

    generator = torch.Generator().manual_seed(3)
    tokens, heads, dim = 37, 5, 32
    qkv = torch.randn(tokens, heads * dim + 2 * dim, generator=generator)
    x = qkv[:, : heads * dim].view(tokens, heads, dim)
    factors = rope_rows(rope_cos_sin_cache(dim, 512, 10000.0, None), torch.randint(0, 512, (tokens,)))
    assert cpu_ops.takes_rope(factors, x)
    swapped = x.unflatten(-1, (2, dim // 2)).flip(-2).flatten(-2)
    assert torch.equal(cpu_ops.rope(factors, x), x * factors[0] + swapped * factors[1])
    assert not cpu_ops.takes_rope(factors, x.bfloat16())
    assert not cpu_ops.takes_rope(factors[:, :-1], x)
