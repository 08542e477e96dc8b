"""`--quantization gguf`, the default for a GGUF file with quantized tensors: the matmul layers and the token
embedding keep the file's blocks (engine/layers/quantized.py, engine/models/gguf_quantized.py) and multiply
through the quantized kernels; the model then computes what the dequantized one (`--quantization none`)
does, within the rounding of its activations; the fused CPU decode step over quantized weights equals the
eager path with the same (one-plane) activations; a layer the kernels cannot take is dequantized, and the startup log says so once."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.config import ConfigError, EngineConfig
from engine.layers.quantized import QuantizedMatmul
from engine.models.gguf_config import QUANTIZED_KERNEL_TYPES
from engine.models.gguf_file import read_gguf
from engine.models.gguf_quantized import weight_bytes_by_type
from engine.models.loader import load_model
from kernels.cpu import ops as cpu_ops
from kernels.cpu import quant as cpu_quant
from kernels.gguf_blocks import QUANT_TYPES
from tests.engine.hf_models import PagedBatchRunner
from tests.engine.models.gguf_files import gguf_model, hf_dirs, write_gguf  # noqa: F401

pytestmark = pytest.mark.skipif(not cpu_quant.available(), reason="needs the CPU kernels (x86 AVX2, a C compiler)")

PROMPTS = {"a": [5, 200, 17, 9, 31, 8], "b": [7, 3, 250]}
MIXED = {"attn_v": "Q8_0", "ffn_down": "Q6_K", "token_embd": "Q8_0"}      # as Q4_K_M mixes types


def _load(path, quantization: str, dtype: str = "float32"):
    config = EngineConfig(model=str(path), dtype=dtype, quantization=quantization, device="cpu").finalize()
    return load_model(config, device="cpu", progress=False)


def _logits(model, steps: int = 3) -> torch.Tensor:
    runner = PagedBatchRunner(model, num_blocks=32, block_size=4)
    out = [torch.cat(list(runner.step(PROMPTS).values()))]
    for i in range(steps):
        out.append(torch.cat(list(runner.step({req: [40 + i + j] for j, req in enumerate(PROMPTS)}).values())))
    return torch.cat(out)


@pytest.fixture(scope="module")
def mixed_gguf(hf_dirs, tmp_path_factory):  # noqa: F811
    path = tmp_path_factory.mktemp("mixed") / "llama-mixed.gguf"
    return write_gguf(hf_dirs("LlamaForCausalLM"), path, "Q5_0", types=MIXED)


def test_the_engine_root_knows_the_kernels_types():
    """engine.models.gguf_config lists them without importing torch; kernels/gguf_blocks defines them."""
    assert set(QUANTIZED_KERNEL_TYPES) == {name for name, _, _ in QUANT_TYPES.values()}


def test_quantization_resolves_per_file(gguf_model, hf_dirs):  # noqa: F811
    assert EngineConfig(model=str(gguf_model("LlamaForCausalLM", "Q4_K"))).finalize().quantization == "gguf"
    assert EngineConfig(model=str(gguf_model("LlamaForCausalLM", "F32"))).finalize().quantization == "none"
    none = EngineConfig(model=str(gguf_model("LlamaForCausalLM", "Q4_K")), quantization="none").finalize()
    assert none.quantization == "none"
    with pytest.raises(ConfigError, match="quantization 'gguf' needs a .gguf model file"):
        EngineConfig(model=str(hf_dirs("LlamaForCausalLM")), quantization="gguf").finalize()
    with pytest.raises(ConfigError, match="quantization must be one of gguf, none"):
        EngineConfig(model=str(gguf_model("LlamaForCausalLM", "Q4_K")), quantization="awq").finalize()


def test_layers_keep_the_files_blocks(mixed_gguf):
    model = _load(mixed_gguf, "gguf")
    layers = [m for m in model.modules() if isinstance(m, QuantizedMatmul)]
    assert layers and all(isinstance(m.qweight, cpu_quant.PackedWeight) for m in layers)
    assert all(m.weight.numel() == 0 for m in layers)                      # no 16-bit copy kept
    qkv = model.model.layers[0].self_attn.qkv_proj.qweight                # q and k merged, v its own part
    assert [(type_id, rows) for type_id, rows, _ in qkv.parts] == [(6, 256 + 128), (8, 128)]
    sizes = weight_bytes_by_type(model)
    in_file = {}
    for info in read_gguf(str(mixed_gguf)).tensors.values():
        in_file[info.type_name] = in_file.get(info.type_name, 0) + info.nbytes
    for name in ("Q5_0", "Q8_0", "Q6_K"):            # the same bytes, give or take the rows padded to 16
        assert in_file[name] <= sizes[name] <= 1.05 * in_file[name], name
    assert sum(sizes.values()) <= 1.15 * sum(in_file.values())


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q5_K", "Q6_K", "mixed"])
def test_logits_match_the_dequantized_model(qtype, gguf_model, mixed_gguf):  # noqa: F811
    path = mixed_gguf if qtype == "mixed" else gguf_model("LlamaForCausalLM", qtype)
    quantized, dequantized = _logits(_load(path, "gguf")), _logits(_load(path, "none"))
    # the eager path's two planes of activations leave ~1/250 of one plane's rounding (cpu/test_quant.py):
    # through two layers of a random model a small fraction of the logits' range; the dequantized model's top
    # token stays on top or within that of it (random models have near-ties)
    tolerance = 0.005 * dequantized.abs().max()
    assert (quantized - dequantized).abs().max() < tolerance
    top = dequantized.argmax(-1, keepdim=True)
    assert (quantized.gather(-1, top).squeeze(-1) >= quantized.max(-1).values - tolerance).all()


@pytest.mark.skipif(not cpu_ops.available(), reason="needs the fused decode kernels")
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_fused_decode_over_quantized_weights_matches_the_eager_path(arch, gguf_model, monkeypatch):  # noqa: F811
    path = gguf_model(arch, "Q4_K")
    fused = _load(path, "gguf", dtype="bfloat16")
    assert fused.cpu_decode is not None, "the fused step should take quantized weights"
    _one_plane(fused)
    calls = []
    original = cpu_ops.DecodeStack.__call__
    monkeypatch.setattr(cpu_ops.DecodeStack, "__call__", lambda self, x, *a: calls.append(1) or original(self, x, *a))
    got = _logits(fused)
    assert calls, "the decode steps did not go through the fused step"
    eager = _load(path, "gguf", dtype="bfloat16")
    eager.cpu_decode = None
    _one_plane(eager)
    torch.testing.assert_close(got, _logits(eager), rtol=1e-4, atol=1e-4)


def _one_plane(model) -> None:
    """The eager layers (prefill here) with the fused step's one 8-bit plane of activations; the LM head,
    outside the step, keeps two on both sides."""
    for layer in model.model.layers.modules():
        if isinstance(layer, QuantizedMatmul):
            layer.precise_activations = False


def test_a_layer_the_kernels_cannot_take_is_dequantized_with_one_message(hf_dirs, tmp_path, caplog):  # noqa: F811
    path = write_gguf(hf_dirs("LlamaForCausalLM"), tmp_path / "f16-v.gguf", "Q8_0", types={"attn_v": "F16"})
    with caplog.at_level(logging.WARNING, logger="engine.models.gguf_quantized"):
        model = _load(path, "gguf")
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.qweight is None and attn.qkv_proj.weight.numel() > 0
    assert attn.o_proj.qweight is not None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "blk.0.attn_q.weight (Q8_0)" in messages[0] and "without a kernel" in messages[0]


@pytest.mark.gpu
def test_triton_path_matches_the_dequantized_model(mixed_gguf):
    """On a GPU, the whole engine (CUDA graphs included) over the Triton kernel: a prompt's logprobs as the
    dequantized bf16 model gives them (the kernel rounds each dequantized tile to bf16 as that model's
    weights are), and the same greedy tokens."""
    from engine import LLM, SamplingParams

    prompt = [(7 * i + 3) % 263 for i in range(40)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)

    def run(quantization):
        with LLM(str(mixed_gguf), skip_tokenizer_init=True, dtype="bfloat16", quantization=quantization,
                 max_model_len=256) as llm:
            assert llm.config.quantization == quantization
            return llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]

    quantized, dequantized = run("gguf"), run("none")
    for token, a, b in zip(prompt[1:], quantized.prompt_logprobs[1:], dequantized.prompt_logprobs[1:], strict=True):
        assert abs(a[token] - b[token]) < 0.1
    assert quantized.outputs[0].token_ids[:4] == dequantized.outputs[0].token_ids[:4]


def test_a_cpu_without_the_kernels_dequantizes_and_says_why(gguf_model, monkeypatch, caplog):  # noqa: F811
    import engine.models.gguf_quantized as plan

    monkeypatch.setattr(plan.cpu_quant, "available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="engine.models.gguf_quantized"):
        model = _load(gguf_model("LlamaForCausalLM", "Q4_0"), "gguf")
    assert not any(getattr(m, "qweight", None) is not None for m in model.modules())
    (message,) = [r.getMessage() for r in caplog.records]
    assert "no quantized CPU kernels here" in message and "blk.0.attn_q.weight (Q4_0)" in message
