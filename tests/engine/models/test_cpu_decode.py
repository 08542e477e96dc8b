"""The fused CPU decode path (engine/models/cpu_decode.py over kernels/cpu/ops.decode_forward16): pure-decode
steps of 16-bit Llama-family models in one C call agree with the eager path to float32 rounding, write the
same KV cache, agree with transformers on the same (16-bit) weights, and stay out of the way where they do
not apply. Skipped where the AVX2 kernels cannot run."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.layers.cpu_matmul import should_upcast
from engine.models.cpu_decode import unsupported_reason
from engine.models.loader import load_model
from kernels.cpu import ops as cpu_ops
from tests.engine.hf_models import (  # noqa: F401
    ARCHITECTURES,
    PagedBatchRunner,
    hf_logits,
    load_hf_model,
    tiny_model_fixture,
)

pytestmark = pytest.mark.skipif(
    not cpu_ops.available() or not should_upcast(torch.device("cpu"), torch.bfloat16),
    reason="needs the AVX2 kernels on a CPU without 16-bit arithmetic",
)

PROMPTS = {"a": [3, 14, 15, 92, 65, 35, 89], "b": [2, 71, 82, 81], "c": [5]}


def _load(path, dtype: str):
    config = EngineConfig(model=str(path), dtype=dtype, device="cpu").finalize()
    return load_model(config, device="cpu", progress=False)


def _count_fused_calls(monkeypatch) -> list[int]:
    calls = []
    original = cpu_ops.DecodeStack.__call__

    def spy(self, x, *args):
        calls.append(x.shape[0])
        return original(self, x, *args)

    monkeypatch.setattr(cpu_ops.DecodeStack, "__call__", spy)
    return calls


def _run(model, steps: int = 5) -> tuple[list[torch.Tensor], PagedBatchRunner]:
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    out = [torch.cat(list(runner.step(PROMPTS).values()))]
    for i in range(steps):
        out.append(torch.cat(list(runner.step({req: [10 + i + j] for j, req in enumerate(PROMPTS)}).values())))
    return out, runner


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_decode_matches_the_eager_path(tiny_model, monkeypatch, arch, dtype):
    model = _load(tiny_model(arch), dtype)
    assert model.cpu_decode is not None, unsupported_reason(model)
    calls = _count_fused_calls(monkeypatch)
    fused, fused_runner = _run(model)
    assert calls == [3] * 5                       # every decode step, never the prefill
    model.cpu_decode = None
    eager, eager_runner = _run(model)
    assert len(calls) == 5
    for got, expected in zip(fused, eager, strict=True):
        torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)
    for got, expected in zip(fused_runner.kv_caches, eager_runner.kv_caches, strict=True):
        # the same keys and values, up to a last-bit rounding of a value computed in a different order
        torch.testing.assert_close(got.float(), expected.float(), atol=1e-2, rtol=1e-2)
        assert (got != expected).float().mean() < 0.01


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_fused_decode_agrees_with_transformers_on_the_same_weights(tiny_model, arch):
    """Our bf16 model decoding through the fused path against transformers in float32 on the bf16-rounded
    weights: the only difference left is our bf16 KV cache."""
    path = tiny_model(arch)
    model = _load(path, "bfloat16")
    assert model.cpu_decode is not None
    hf = load_hf_model(path)
    with torch.no_grad():
        for param in hf.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    tokens = list(PROMPTS["a"])
    logits = runner.step({"a": tokens})["a"][-1]
    ours = []
    for _ in range(6):
        tokens.append(int(logits.argmax()))
        logits = runner.step({"a": tokens[-1:]})["a"][-1]
        ours.append(logits)
    reference = hf_logits(hf, tokens)[len(PROMPTS["a"]):]
    torch.testing.assert_close(torch.stack(ours), reference, atol=3e-2, rtol=3e-2)
    assert torch.equal(torch.stack(ours).argmax(-1), reference.argmax(-1))


def test_a_padding_slot_writes_nothing_and_leaves_the_other_rows_alone(tiny_model):
    model = _load(tiny_model("LlamaForCausalLM"), "bfloat16")
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    runner.step({"a": PROMPTS["a"], "b": PROMPTS["b"]})
    stack = model.cpu_decode._build(runner.kv_caches)
    before = [cache.clone() for cache in runner.kv_caches]
    embed = model.model.embed_tokens(torch.tensor([7, 9])).float()
    lens, tables = torch.tensor([8, 5], dtype=torch.int32), torch.tensor(
        [runner.block_tables["a"], runner.block_tables["b"] + [0]], dtype=torch.int32)
    slot_a = runner.block_tables["a"][1] * 4 + 3
    both = stack(embed.clone(), torch.tensor([7, 4]), torch.tensor([slot_a, -1]), lens, tables)
    written = [cache.clone() for cache in runner.kv_caches]
    for cache, old in zip(runner.kv_caches, before, strict=True):
        cache.copy_(old)
    alone = stack(embed[:1].clone(), torch.tensor([7]), torch.tensor([slot_a]), lens[:1], tables[:1])
    torch.testing.assert_close(both[0], alone[0], atol=0, rtol=0)
    for cache, with_padding in zip(runner.kv_caches, written, strict=True):
        assert torch.equal(cache, with_padding)          # the padding row wrote nothing
    assert torch.isfinite(both[1]).all()


def test_decode_stack_rejects_bad_inputs(tiny_model):
    model = _load(tiny_model("LlamaForCausalLM"), "bfloat16")
    runner = PagedBatchRunner(model, num_blocks=8, block_size=4)
    stack = model.cpu_decode._build(runner.kv_caches)
    one = (torch.tensor([0]), torch.tensor([4]), torch.tensor([1], dtype=torch.int32),
           torch.tensor([[1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="float32"):
        stack(torch.zeros(1, 64, dtype=torch.bfloat16), *one)
    with pytest.raises(ValueError, match="rotary table"):
        stack(torch.zeros(1, 64), torch.tensor([10**6]), *one[1:])
    with pytest.raises(ValueError, match="one position"):
        stack(torch.zeros(2, 64), *one)


def test_where_the_fused_path_does_not_apply(tiny_model, monkeypatch):
    path = tiny_model("Qwen3ForCausalLM")
    assert _load(path, "float32").cpu_decode is None          # fp32 models: the eager path
    model = _load(path, "bfloat16")
    assert model.cpu_decode is not None and unsupported_reason(model) is None
    monkeypatch.setenv("RINGSERVE_CPU_FUSED_DECODE", "0")
    assert unsupported_reason(model) == "RINGSERVE_CPU_FUSED_DECODE=0"
    assert _load(path, "bfloat16").cpu_decode is None


def test_a_cache_the_kernels_cannot_take_falls_back_to_the_eager_path(tiny_model):
    """A KV cache in another dtype than the weights: the stack is refused once, the eager path answers."""
    model = _load(tiny_model("LlamaForCausalLM"), "bfloat16")
    runner = PagedBatchRunner(model, num_blocks=16, block_size=4)
    runner.kv_caches = [cache.half() for cache in runner.kv_caches]
    runner.step({"a": PROMPTS["a"]})
    logits = runner.step({"a": [9]})["a"]
    assert "kv_cache must be" in (model.cpu_decode.disabled or "")
    assert torch.isfinite(logits).all()


def test_the_fused_path_takes_as_many_rows_as_gemm16_does(tiny_model, monkeypatch):
    """Decode batches up to MAX_ROWS, or up to gemm16's own limit where that is higher (its AVX-512 tiles):
    the limits shrunk here so that the three requests of _run cross them."""
    from engine.models import cpu_decode

    model = _load(tiny_model("LlamaForCausalLM"), "bfloat16")
    calls = _count_fused_calls(monkeypatch)
    monkeypatch.setattr(cpu_decode, "MAX_ROWS", 2)
    monkeypatch.setattr(cpu_decode, "gemm16_max_rows", lambda: 2)
    _run(model, steps=2)
    assert calls == []                                # 3 rows: over both limits, the eager path
    monkeypatch.setattr(cpu_decode, "gemm16_max_rows", lambda: 4)
    _run(model, steps=2)
    assert calls == [3, 3]
