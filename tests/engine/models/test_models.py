"""The decoder against HF transformers on the same random weights (fp32, tight tolerance), through the paged
KV cache: batched prefill, decode steps, mixed batches and chunked prefill; and config.json parsing."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import SUPPORTED_ARCHITECTURES, ConfigError, EngineConfig
from engine.models import MODEL_REGISTRY, ModelArgs, get_model_class
from engine.models.encoder_args import ENCODER_ARCHITECTURES
from engine.models.loader import load_model
from tests.conftest import shared_path
from tests.engine.hf_models import (  # noqa: F401  (the tiny_model fixture)
    ARCHITECTURES,
    PagedBatchRunner,
    hf_logits,
    load_hf_model,
    tiny_model_fixture,
)

TOLERANCE = dict(rtol=1e-4, atol=1e-4)
PROMPTS = {
    "a": [(7 * i + 3) % 512 for i in range(13)],
    "b": [5, 300, 17],
    "c": [(11 * i + 1) % 512 for i in range(30)],
}


def _ours(path, **config):
    return load_model(EngineConfig(model=str(path), **config), device="cpu", progress=False)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_prefill_then_decode_matches_hf(arch, tiny_model):
    path = tiny_model(arch)
    model, hf = _ours(path), load_hf_model(path)
    runner = PagedBatchRunner(model)
    sequences = {req: list(tokens) for req, tokens in PROMPTS.items()}

    logits = runner.step(sequences)
    for req, tokens in sequences.items():
        torch.testing.assert_close(logits[req], hf_logits(hf, tokens), **TOLERANCE)

    for step in range(3):
        new = {req: [int(logits[req][-1].argmax())] for req in sequences}
        if step == 1:
            new["d"] = [9, 8, 7, 6, 5, 4]           # a prefill joins a decode batch
        for req, tokens in new.items():
            sequences.setdefault(req, []).extend(tokens)
        logits = runner.step(new)
        for req in new:
            expected = hf_logits(hf, sequences[req])[-len(new[req]):]
            torch.testing.assert_close(logits[req], expected, **TOLERANCE)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_chunked_prefill_matches_unchunked(arch, tiny_model):
    model = _ours(tiny_model(arch))
    prompt = PROMPTS["c"][:23]
    whole = PagedBatchRunner(model).step({"r": prompt})["r"]
    chunked = PagedBatchRunner(model, seed=1)
    first = chunked.step({"r": prompt[:6]})["r"]           # the boundary falls inside a block
    second = chunked.step({"r": prompt[6:]})["r"]           # attends to the cached first chunk
    torch.testing.assert_close(torch.cat([first, second]), whole, **TOLERANCE)


def test_model_exposes_what_the_runner_needs(tiny_model):
    model = _ours(tiny_model("Qwen3ForCausalLM"))
    assert (model.num_layers, model.num_kv_heads, model.head_dim, model.dtype) == (2, 2, 32, torch.float32)
    hidden = torch.zeros(3, 64)
    logits = model.compute_logits(hidden)
    assert logits.shape == (3, 512) and logits.dtype == torch.float32


def test_tied_embeddings_share_one_tensor(tiny_model):
    tied = _ours(tiny_model("Qwen2ForCausalLM"))
    untied = _ours(tiny_model("MistralForCausalLM"))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_registry_covers_exactly_the_supported_architectures():
    assert set(MODEL_REGISTRY) == set(SUPPORTED_ARCHITECTURES) | set(ENCODER_ARCHITECTURES)


def test_unknown_architecture_names_the_supported_ones():
    with pytest.raises(ConfigError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        get_model_class("GPT2LMHeadModel")
    with pytest.raises(ConfigError, match="supported: LlamaForCausalLM, MistralForCausalLM"):
        ModelArgs.from_hf_config({"model_type": "gpt2"}, "GPT2LMHeadModel")


# ---------------------------------------------------------------------------------- config.json parsing
def _parse(hf: dict, max_model_len: int | None = None) -> ModelArgs:
    return ModelArgs.from_hf_config(hf, hf["architectures"][0], max_model_len)


def _hf_config(tiny_model, arch: str) -> dict:
    return json.loads((tiny_model(arch) / "config.json").read_text())


def test_feature_flags_per_architecture(tiny_model):
    flags = {arch: _parse(_hf_config(tiny_model, arch)) for arch in ARCHITECTURES}
    assert (flags["Qwen2ForCausalLM"].qkv_bias, flags["Qwen2ForCausalLM"].o_bias) == (True, False)
    assert flags["Qwen3ForCausalLM"].qk_norm and not flags["LlamaForCausalLM"].qk_norm
    assert flags["Qwen3ForCausalLM"].head_dim == 32 and flags["LlamaForCausalLM"].head_dim == 16
    assert flags["Qwen2ForCausalLM"].tie_word_embeddings and not flags["LlamaForCausalLM"].tie_word_embeddings
    assert not any(flags[a].qkv_bias for a in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"))


def test_llama3_rope_scaling_is_read_from_both_config_layouts(tiny_model):
    new_layout = _parse(_hf_config(tiny_model, "LlamaForCausalLM"))   # rope_parameters
    assert new_layout.rope_scaling["rope_type"] == "llama3"
    assert new_layout.rope_scaling["original_max_position_embeddings"] == 32
    old = json.loads((shared_path("models", "configs", "llama-3.2-1b") / "config.json").read_text())
    old_layout = _parse(old, max_model_len=4096)                     # rope_theta + rope_scaling
    assert old_layout.rope_theta == 500000.0 and old_layout.rope_scaling["factor"] == 32.0
    assert old_layout.max_positions == 4096


def test_attention_bias_and_mlp_bias_of_llama(tiny_model):
    args = _parse({**_hf_config(tiny_model, "LlamaForCausalLM"),
                                     "attention_bias": True, "mlp_bias": True})
    assert (args.qkv_bias, args.o_bias, args.mlp_bias) == (True, True, True)


def test_sliding_window_is_refused_only_when_it_would_slide(tiny_model):
    mistral = {**_hf_config(tiny_model, "MistralForCausalLM"), "sliding_window": 128}
    with pytest.raises(ConfigError, match="sliding-window attention.*max_model_len <= 128"):
        _parse(mistral)                      # max_position_embeddings 256 > 128
    assert _parse(mistral, max_model_len=128).max_positions == 128
    qwen = json.loads((shared_path("models", "configs", "qwen2.5-0.5b") / "config.json").read_text())
    assert not qwen["use_sliding_window"]
    _parse({**qwen, "sliding_window": 16})  # declared but switched off: full attention


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "'yarn' is not supported"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0}},
         "llama3 rope scaling lacks low_freq_factor"),
    ],
)
def test_unsupported_model_features_are_clear_errors(tiny_model, change, message):
    with pytest.raises(ConfigError, match=message):
        _parse({**_hf_config(tiny_model, "LlamaForCausalLM"), **change})


def test_benchmark_prints_its_figures(tiny_model):
    from click.testing import CliRunner

    from tools.bench_model import main

    args = [str(tiny_model("Qwen3ForCausalLM")), "--batch", "2", "--prompt-len", "8", "--decode-steps", "2",
            "--block-size", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "prefill 2 x 8" in result.output and "tok/s" in result.output and "GB/s" in result.output
