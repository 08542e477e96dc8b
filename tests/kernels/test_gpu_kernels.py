"""On a CUDA GPU, with real model shapes (Llama-3-8B: 32 query heads, 8 KV heads, head_dim 128): each
Triton kernel against its torch reference, the backend against TorchAttention, the dispatchers'
routing of CUDA tensors, and replay of the decode path inside a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch

import kernels
from engine.attention import AttentionMetadata, TorchAttention
from engine.attention.triton_backend import TritonAttention
from kernels.rotary import rope_cos_sin_cache
from kernels.triton_activation import silu_and_mul_triton
from kernels.triton_decode_attention import paged_decode_attention_triton
from kernels.triton_kv_cache import write_kv_cache_triton
from kernels.triton_paged_attention import paged_attention_triton
from kernels.triton_rms_norm import rms_norm_triton
from kernels.triton_rotary import rotary_embedding_triton
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.tolerances import TOLERANCES

pytestmark = pytest.mark.gpu

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # fp32 attention on the GPU runs tf32x3 dots and the reference may use TF32 too: looser than on the CPU
    tolerance = {"atol": 2e-4, "rtol": 2e-4} if expected.dtype == torch.float32 else TOLERANCES[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **tolerance)


def _cuda_randn(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_kernels_real_shapes(dtype):
    torch.manual_seed(0)
    x, residual = _cuda_randn(512, 4096, dtype=dtype), _cuda_randn(512, 4096, dtype=dtype)
    weight = _cuda_randn(4096, dtype=dtype)
    for got, want in zip(rms_norm_triton(x, weight, 1e-5, residual),
                         kernels.rms_norm_torch(x, weight, 1e-5, residual), strict=True):
        _assert_close(got, want)
    gate_up = _cuda_randn(512, 2 * 14336, dtype=dtype)
    _assert_close(silu_and_mul_triton(gate_up), kernels.silu_and_mul_torch(gate_up))
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    table = rope_cos_sin_cache(HEAD_DIM, 32768, 500000.0, scaling).cuda()
    qkv = _cuda_randn(512, HEADS + 2 * KV_HEADS, HEAD_DIM, dtype=dtype)
    query, key = qkv[:, :HEADS], qkv[:, HEADS:HEADS + KV_HEADS]
    positions = torch.randint(0, 32768, (512,), device="cuda")
    for got, want in zip(rotary_embedding_triton(positions, query, key, table),
                         kernels.rotary_embedding_torch(positions, query, key, table), strict=True):
        _assert_close(got, want)


def test_kv_cache_write_real_shapes():
    cache = torch.zeros(2, 2048, 16, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    expected = cache.clone()
    key, value = _cuda_randn(4096, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16), _cuda_randn(
        4096, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    slots = torch.randperm(2048 * 16, device="cuda")[:4096]
    slots[::7] = -1
    write_kv_cache_triton(key, value, cache[0], cache[1], slots)
    kernels.write_kv_cache_torch(key, value, expected[0], expected[1], slots)
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_attention_real_shapes(dtype):
    # a fresh 1000-token prompt, a 512-token chunk on a 2048-token cached prefix, and 30 long decodes
    query_lens = [1000, 512] + [1] * 30
    context_lens = [0, 2048] + [100 * i + 37 for i in range(30)]
    batch = make_paged_batch(query_lens, context_lens, num_heads=HEADS, num_kv_heads=KV_HEADS,
                             head_dim=HEAD_DIM, dtype=dtype).to("cuda")
    batch.write_new_tokens()
    args = (batch.query, batch.key_cache, batch.value_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, batch.scale)
    _assert_close(paged_attention_triton(*args), kernels.paged_attention_torch(*args))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("context_lens", [[8191], [37 * i + 1 for i in range(64)]], ids=["long", "batch64"])
def test_decode_attention_real_shapes(dtype, context_lens):
    batch = make_paged_batch([1] * len(context_lens), context_lens, num_heads=HEADS, num_kv_heads=KV_HEADS,
                             head_dim=HEAD_DIM, dtype=dtype).to("cuda")
    batch.write_new_tokens()
    args = (batch.query, batch.key_cache, batch.value_cache, batch.seq_lens, batch.block_tables, batch.scale)
    _assert_close(paged_decode_attention_triton(*args), kernels.paged_decode_attention_torch(*args))


def test_backend_matches_torch_backend_on_gpu():
    query_lens, context_lens = [300, 1, 1, 64], [0, 900, 4000, 128]
    batch = make_paged_batch(query_lens, context_lens, num_heads=HEADS, num_kv_heads=KV_HEADS,
                             head_dim=HEAD_DIM, dtype=torch.bfloat16, padding_tokens=3).to("cuda")
    metadata = AttentionMetadata(batch.slot_mapping, batch.query_start_loc, batch.seq_lens, batch.block_tables,
                                 max(query_lens), int(batch.seq_lens.max()), sum(query_lens))
    torch_cache, triton_cache = batch.kv_cache, batch.kv_cache
    expected = TorchAttention().forward(batch.query, batch.key, batch.value, torch_cache, metadata, batch.scale)
    actual = TritonAttention().forward(batch.query, batch.key, batch.value, triton_cache, metadata, batch.scale)
    _assert_close(actual[:sum(query_lens)], expected[:sum(query_lens)])
    assert torch.equal(triton_cache, torch_cache)


def test_dispatchers_route_cuda_tensors_to_triton(monkeypatch):
    import kernels.triton_rms_norm as module

    calls = []
    original = module.rms_norm_triton
    monkeypatch.setattr(module, "rms_norm_triton", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.delenv("RINGSERVE_KERNELS", raising=False)
    x = _cuda_randn(4, 64, dtype=torch.bfloat16)
    kernels.rms_norm(x, torch.ones(64, device="cuda", dtype=torch.bfloat16), 1e-6)
    assert calls == [1]


def test_decode_replays_in_a_cuda_graph_with_new_lengths():
    context_lens = [500, 90, 2000, 7]
    batch = make_paged_batch([1] * 4, context_lens, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                             dtype=torch.bfloat16).to("cuda")
    batch.write_new_tokens()
    seq_lens = batch.seq_lens.clone()
    out = torch.empty_like(batch.query)

    def step():
        paged_decode_attention_triton(batch.query, batch.key_cache, batch.value_cache, seq_lens,
                                      batch.block_tables, batch.scale, out=out)

    step()                                                    # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # the next step: shorter views of the same requests, written into the captured tensors in place
    seq_lens.copy_(torch.tensor([400, 91, 1500, 1], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expected = kernels.paged_decode_attention_torch(batch.query, batch.key_cache, batch.value_cache, seq_lens,
                                                    batch.block_tables, batch.scale)
    _assert_close(out, expected)
