"""bf16 models on CPUs without bf16 matmul units multiply in fp32 from exact fp32 weight copies."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.layers.cpu_matmul import UpcastMatmul
from engine.models.loader import load_model
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
