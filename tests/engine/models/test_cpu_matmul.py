"""bf16 models on CPUs without bf16 matmul units multiply in fp32 from exact fp32 weight copies, or with
kernels/cpu/ops straight from the 16-bit weights, and carry float32 activations."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.layers.cpu_matmul import UpcastMatmul, should_upcast
from engine.models.loader import load_model
from kernels.cpu import ops as cpu_ops
from tests.engine.hf_models import PagedBatchRunner, tiny_model_fixture  # noqa: F401


def _logits(path, monkeypatch, upcast: str) -> tuple[torch.Tensor, torch.nn.Module]:
    monkeypatch.setenv("RINGSERVE_CPU_UPCAST_MATMUL", upcast)
    config = EngineConfig(model=str(path), dtype="bfloat16", device="cpu").finalize()
    model = load_model(config, device="cpu", progress=False)
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    return runner.step({0: [3, 14, 15, 92, 65, 35, 89, 79]})[0], model


def test_upcast_matches_native_bf16_within_bf16_rounding(tiny_model, monkeypatch):
    path = tiny_model("Qwen3ForCausalLM")
    native, native_model = _logits(path, monkeypatch, "0")
    upcast, upcast_model = _logits(path, monkeypatch, "1")
    layers = [m for m in upcast_model.modules() if isinstance(m, UpcastMatmul)]
    assert layers and all(m.compute_weight is not None and m.compute_weight.dtype == torch.float32
                          for m in layers)
    assert all(m.compute_weight is None for m in native_model.modules() if isinstance(m, UpcastMatmul))
    # the fp32 copies are exact: the bf16 weights convert losslessly
    assert all(torch.equal(m.compute_weight.to(torch.bfloat16), m.weight) for m in layers)
    assert upcast.dtype == torch.float32
    torch.testing.assert_close(upcast, native, atol=0.05, rtol=0.05)
    assert torch.equal(upcast.argmax(-1), native.argmax(-1))


def _steps(path, dtype: str) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """A prefill of two requests, then three pure-decode steps of both (the C kernels' decode shapes)."""
    config = EngineConfig(model=str(path), dtype=dtype, device="cpu").finalize()
    model = load_model(config, device="cpu", progress=False)
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    out = runner.step({"a": [3, 14, 15, 92, 65, 35, 89], "b": [2, 71, 82, 81]})
    logits = [torch.cat(list(out.values()))]
    for token in (7, 8, 9):
        logits.append(torch.cat(list(runner.step({"a": [token], "b": [token + 1]}).values())))
    return logits, model


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_cpu_kernels_match_the_torch_path(tiny_model, monkeypatch, arch):
    """With kernels/cpu/ops (16-bit matmul, decode attention) the bf16 model computes what the torch path
    computes within bf16 rounding, and carries float32 activations over its 16-bit weights either way."""
    if not cpu_ops.available() or not should_upcast(torch.device("cpu"), torch.bfloat16):
        pytest.skip("needs the AVX2 kernels on a CPU without bf16 arithmetic")
    path = tiny_model(arch)
    fast, fast_model = _steps(path, "bfloat16")
    assert fast_model.activation_dtype == torch.float32
    assert all(m.gemm16 for m in fast_model.modules() if isinstance(m, UpcastMatmul))
    monkeypatch.setattr(cpu_ops, "available", lambda: False)
    slow, slow_model = _steps(path, "bfloat16")
    assert not any(m.gemm16 for m in slow_model.modules() if isinstance(m, UpcastMatmul))
    for got, expected in zip(fast, slow, strict=True):
        torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)   # random weights: near-ties flip


@pytest.mark.parametrize(("flags", "bf16", "fp16"), [
    ("fma avx2 f16c", False, False),                              # AVX2 only: neither is native
    ("fma avx2 f16c avx512f avx512_bf16", True, False),           # e.g. AMD Zen 4: bf16 only
    ("fma avx2 avx512_bf16 avx512_fp16 amx_bf16", True, True),    # e.g. Sapphire Rapids
])
def test_native_half_matmul_is_asked_per_dtype(monkeypatch, flags, bf16, fp16):
    """An AVX-512 BF16 CPU multiplies bf16 natively, not fp16: a float16 model there still needs the fp32
    copies or the kernels (it used to run torch's fp16 matmul, ~10x slower on a 256-token prefill)."""
    from engine.layers import cpu_matmul

    monkeypatch.setattr(cpu_ops, "cpu_flags", lambda: frozenset(flags.split()))
    monkeypatch.delenv("RINGSERVE_CPU_UPCAST_MATMUL", raising=False)
    assert cpu_matmul.cpu_has_native_half_matmul(torch.bfloat16) is bf16
    assert cpu_matmul.cpu_has_native_half_matmul(torch.float16) is fp16
    for kernels in (False, True):
        monkeypatch.setattr(cpu_ops, "available", lambda k=kernels: k)
        assert should_upcast(torch.device("cpu"), torch.float16) is (not fp16 or kernels)
        assert should_upcast(torch.device("cpu"), torch.bfloat16) is (not bf16 or kernels)
        assert not should_upcast(torch.device("cpu"), torch.float32)


def test_native_bf16_layers_keep_no_float32_copy(tiny_model, monkeypatch):
    """Where bf16 is native (AVX-512 BF16), the upcast path keeps the kernels for small inputs and gives large
    ones to torch's bf16 matmul: no float32 copy is made, activations stay float32 around it, and the logits
    agree with the float32-copy path within bf16 rounding."""
    from engine.layers import cpu_matmul

    path = tiny_model("Qwen3ForCausalLM")
    copies, copies_model = _logits(path, monkeypatch, "1")
    monkeypatch.delenv("RINGSERVE_CPU_UPCAST_MATMUL")
    monkeypatch.setattr(cpu_matmul, "cpu_has_native_half_matmul", lambda dtype: dtype == torch.bfloat16)
    monkeypatch.setattr(cpu_matmul, "gemm16_max_rows", lambda: 2)   # the 8-token prompt takes the native matmul
    config = EngineConfig(model=str(path), dtype="bfloat16", device="cpu").finalize()
    model = load_model(config, device="cpu", progress=False)
    layers = [m for m in model.modules() if isinstance(m, UpcastMatmul)]
    assert layers and all(m.upcast_done and m.compute_weight is None for m in layers)
    assert model.activation_dtype == torch.float32
    native = PagedBatchRunner(model, num_blocks=32, block_size=4).step({0: [3, 14, 15, 92, 65, 35, 89, 79]})[0]
    assert native.dtype == torch.float32
    torch.testing.assert_close(native, copies, atol=0.05, rtol=0.05)
    assert torch.equal(native.argmax(-1), copies.argmax(-1))
    assert any(m.compute_weight is not None for m in copies_model.modules() if isinstance(m, UpcastMatmul))
