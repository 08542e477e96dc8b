"""TritonAttention against TorchAttention on the same metadata and caches (Triton's interpreter on the
CPU): the same outputs, the same cache contents afterwards, for a mixed step and a padded pure-decode step."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttention, get_attention_backend
from engine.attention.triton_backend import TritonAttention
from tests.kernels.paged_batch import PagedBatch, make_paged_batch
from tests.kernels.tolerances import assert_close

pytestmark = pytest.mark.interpreter      # CPU tensors under TRITON_INTERPRET (tests/conftest.py)


def _metadata(batch: PagedBatch, query_lens: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=max(query_lens),
        max_seq_len=int(batch.seq_lens.max()),
        num_actual_tokens=sum(query_lens),
    )


def _run_both(batch: PagedBatch, metadata: AttentionMetadata) -> None:
    torch_cache, triton_cache = batch.kv_cache, batch.kv_cache
    expected = TorchAttention().forward(batch.query, batch.key, batch.value, torch_cache, metadata, batch.scale)
    actual = TritonAttention().forward(batch.query, batch.key, batch.value, triton_cache, metadata, batch.scale)
    rows = metadata.num_actual_tokens
    assert_close(actual[:rows], expected[:rows])
    assert torch.equal(triton_cache, torch_cache)             # both wrote the same new keys and values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_step_matches_torch_backend(dtype):
    query_lens, context_lens = [1, 12, 1, 4], [30, 0, 16, 20]
    batch = make_paged_batch(query_lens, context_lens, num_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype)
    _run_both(batch, _metadata(batch, query_lens))


def test_padded_pure_decode_step_matches_torch_backend():
    # two padding tokens after the three decode tokens (slot -1), as a CUDA-graph-sized batch has
    query_lens, context_lens = [1, 1, 1], [15, 64, 90]
    batch = make_paged_batch(query_lens, context_lens, num_heads=4, num_kv_heads=1, head_dim=32,
                             padding_tokens=2)
    metadata = _metadata(batch, query_lens)
    assert metadata.is_pure_decode
    _run_both(batch, metadata)
    out = TritonAttention().forward(batch.query, batch.key, batch.value, batch.kv_cache, metadata, batch.scale)
    assert torch.equal(out[3:], torch.zeros_like(out[3:]))   # padding rows are zeros, never garbage


def test_registry_builds_the_triton_backend():
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttention) and backend.name == "triton"


def test_decode_steps_take_the_split_k_kernel_and_mixed_steps_the_mixed_kernel(monkeypatch):
    import engine.attention.triton_backend as backend_module

    taken: list[str] = []
    for name in ("paged_attention_triton", "paged_decode_attention_triton"):
        original = getattr(backend_module, name)
        monkeypatch.setattr(backend_module, name,
                            lambda *a, _original=original, _name=name, **k: taken.append(_name) or _original(*a, **k))
    for query_lens, context_lens in (([1, 1], [8, 20]), ([1, 3], [8, 20])):
        batch = make_paged_batch(query_lens, context_lens, num_heads=2, num_kv_heads=1, head_dim=32)
        TritonAttention().forward(batch.query, batch.key, batch.value, batch.kv_cache,
                                  _metadata(batch, query_lens), batch.scale)
    assert taken == ["paged_decode_attention_triton", "paged_attention_triton"]
