"""Default sampling (engine/generation_config.py): vLLM's --generation-config {auto,vllm,PATH} and
--override-generation-config, llama.cpp's defaults for a GGUF file that states none, and `LLM(...)` sampling
with them when a call passes no params (a request's own values always win)."""

from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from engine.config import ConfigError, EngineConfig
from engine.generation_config import LLAMA_CPP_DEFAULTS
from tests.engine.hf_models import make_tiny_model
from tests.engine.models.gguf_files import GGUF_TINY, write_gguf


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = make_tiny_model("LlamaForCausalLM", tmp_path_factory.mktemp("llama"))
    (path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "bos_token_id": 1, "max_new_tokens": 99}))
    return path


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return write_gguf(make_tiny_model("Qwen2ForCausalLM", root / "hf", **GGUF_TINY), root / "m.gguf", "Q8_0")


def defaults(model, **options) -> dict:
    return EngineConfig(model=str(model), device="cpu", **options).finalize().sampling_defaults.values


def test_auto_takes_the_models_generation_config(model_dir):
    assert defaults(model_dir) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 99}


def test_vllm_means_no_defaults_and_the_override_applies_on_top_of_either(model_dir):
    assert defaults(model_dir, generation_config="vllm") == {}
    assert defaults(model_dir, generation_config="vllm", override_generation_config={"temperature": 0.5}) == \
        {"temperature": 0.5}
    assert defaults(model_dir, override_generation_config={"top_k": 5, "min_p": 0.1}) == \
        {"temperature": 0.6, "top_p": 0.9, "top_k": 5, "max_tokens": 99, "min_p": 0.1}
    assert defaults(model_dir, override_generation_config={"do_sample": False})["temperature"] == 0.0


def test_a_path_is_a_folder_with_a_generation_config_or_the_file(model_dir, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "repetition_penalty": 1.1}))
    expected = {"temperature": 0.2, "repetition_penalty": 1.1}
    assert defaults(model_dir, generation_config=str(tmp_path)) == expected
    assert defaults(model_dir, generation_config=str(tmp_path / "generation_config.json")) == expected


def test_a_gguf_without_sampling_keys_gets_llama_cpps_defaults(gguf_path):
    config = EngineConfig(model=str(gguf_path), device="cpu").finalize()
    assert config.sampling_defaults.values == LLAMA_CPP_DEFAULTS == \
        {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    assert "llama.cpp's" in config.sampling_defaults.describe()
    assert defaults(gguf_path, generation_config="vllm") == {}


def test_a_ggufs_own_sampling_keys_come_first(tmp_path):
    hf = make_tiny_model("Qwen2ForCausalLM", tmp_path / "hf", **GGUF_TINY)
    path = write_gguf(hf, tmp_path / "s.gguf", "Q8_0",
                      metadata={"general.sampling.temp": 0.25, "general.sampling.top_k": 10})
    assert defaults(path) == {**LLAMA_CPP_DEFAULTS, "temperature": 0.25, "top_k": 10}


@pytest.mark.parametrize("options,message", [
    ({"generation_config": "/no/such/folder"}, "'auto', 'vllm' or a folder"),
    ({"override_generation_config": {"temprature": 0.5}}, "unknown field.*temprature"),
    ({"override_generation_config": {"temperature": -1}}, "temperature must be at least 0"),
    ({"override_generation_config": {"max_new_tokens": 0}}, "max_tokens must be at least 1"),
])
def test_bad_options_are_config_errors_naming_the_problem(model_dir, options, message):
    with pytest.raises(ConfigError, match=message):
        defaults(model_dir, **options)


def test_an_empty_folder_is_named(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="holds no generation_config.json"):
        defaults(model_dir, generation_config=str(tmp_path))


def test_offline_llm_samples_with_the_defaults_and_requests_override_them(gguf_path):
    with LLM(str(gguf_path), in_process=True, max_model_len=128, kv_cache_memory=8 << 20) as llm:
        params = llm.get_default_sampling_params()
        assert (params.temperature, params.top_k, params.top_p, params.min_p, params.max_tokens) == \
            (0.8, 40, 0.95, 0.05, 16)
        own = SamplingParams(temperature=0.0, top_k=3).resolved(llm.engine.generation_defaults)
        assert (own.temperature, own.top_k, own.top_p) == (0.0, 3, 0.95)
        assert len(llm.generate("hello", use_tqdm=False)[0].outputs[0].token_ids) <= 16
    with LLM(str(gguf_path), in_process=True, max_model_len=128, kv_cache_memory=8 << 20,
             generation_config="vllm", override_generation_config={"max_new_tokens": 4}) as llm:
        params = llm.get_default_sampling_params()
        assert (params.temperature, params.top_k, params.max_tokens) == (1.0, 0, 4)
