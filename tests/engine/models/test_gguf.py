"""GGUF files: the header reader, config from metadata, the tokenizer, and each supported tensor type loaded by
ringserve (dequantized: `--quantization none`) and by transformers (`from_pretrained(..., gguf_file=)`)
generating the same greedy tokens (fp32); the quantized kernels' path is tests/engine/models/test_gguf_quantized.py.

The tiny files are written by tests/engine/models/gguf_files.py as llama.cpp lays them out (Llama's q/k rows
permuted). transformers dequantizes with the same `gguf` package, so the per-type tests pin the tensor
naming, the un-permutation, the config mapping and the engine path; the F32 test also checks against the
original HF weights, which does not go through anybody's GGUF code.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.client.tokenizer import eos_token_ids, load_tokenizer
from engine.config import ConfigError, EngineConfig
from engine.models.gguf_config import SUPPORTED_TYPES, gguf_hf_config
from engine.models.gguf_file import read_gguf
from engine.models.loader import load_model
from tests.engine.hf_models import PagedBatchRunner, hf_logits, load_hf_model
from tests.engine.models.gguf_files import VOCAB, gguf_model, hf_dirs, random_k_blocks, write_gguf  # noqa: F401

PROMPTS = [[5, 200, 17, 9], [(7 * i + 3) % VOCAB for i in range(23)], [VOCAB - 2, 104, 101, 108]]
NEW_TOKENS = 10


def _hf_greedy(model, prompt: list[int]) -> list[int]:
    tokens = list(prompt)
    for _ in range(NEW_TOKENS):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt):]


CASES = [("LlamaForCausalLM", t) for t in SUPPORTED_TYPES] + [
    (arch, t) for arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") for t in ("F32", "Q4_K")]


@pytest.mark.parametrize(("arch", "qtype"), CASES)
def test_greedy_tokens_match_transformers_on_the_same_gguf(arch, qtype, gguf_model):
    from transformers import AutoModelForCausalLM

    path = gguf_model(arch, qtype)
    assert qtype in {t.type_name for t in read_gguf(str(path)).tensors.values()}
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    expected = [_hf_greedy(hf, p) for p in PROMPTS]
    with LLM(str(path), dtype="float32", quantization="none", in_process=True, max_model_len=256,
             kv_cache_memory=8 << 20) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                               SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                               use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_f32_gguf_equals_the_original_hf_weights(arch, hf_dirs, gguf_model):
    """No GGUF code on the oracle's side: the un-permuted q/k must give the HF model's own logits."""
    ours = load_model(EngineConfig(model=str(gguf_model(arch, "F32")), dtype="float32"), device="cpu",
                      progress=False)
    hf = load_hf_model(hf_dirs(arch))
    runner = PagedBatchRunner(ours)
    logits = runner.step({"a": PROMPTS[1]})["a"]
    torch.testing.assert_close(logits, hf_logits(hf, PROMPTS[1]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_config_from_metadata_matches_config_json(arch, hf_dirs, gguf_model):
    import json

    original = json.loads((hf_dirs(arch) / "config.json").read_text())
    config = gguf_hf_config(str(gguf_model(arch, "Q8_0")))
    assert config["architectures"] == [arch]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings"):
        assert config[key] == original[key], key
    assert config["rms_norm_eps"] == pytest.approx(original["rms_norm_eps"])
    assert config["attention_bias"] == (arch == "Qwen2ForCausalLM")
    assert config["eos_token_id"] == VOCAB - 1 and config["torch_dtype"] == "float16"
    assert gguf_hf_config(str(gguf_model(arch, "F32")))["torch_dtype"] == "float32"


def test_reader_agrees_with_gguf_reader(gguf_model):
    import gguf

    path = str(gguf_model("Qwen2ForCausalLM", "Q4_0"))
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert set(ours.metadata) == set(theirs.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key, field in theirs.fields.items():
        if key in ours.metadata:
            assert ours.metadata[key] == pytest.approx(field.contents()), key
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert (info.shape, info.type_id, info.offset, info.nbytes) == (
            tuple(reversed([int(d) for d in t.shape])), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))


def test_tokenizer_and_chat_template_come_from_the_gguf(gguf_model):
    from transformers import AutoTokenizer

    path = gguf_model("Qwen3ForCausalLM", "Q8_0")
    config = EngineConfig(model=str(path)).finalize()
    ours = load_tokenizer(config)
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "hello the world <|im_end|> ünïcode"
    assert ours.encode(text) == reference.encode(text)
    messages = [{"role": "user", "content": "Hi"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert eos_token_ids(config, ours) == [VOCAB - 1] == [ours.convert_tokens_to_ids("<|im_end|>")]


def test_unsupported_tensor_type_is_a_clear_error(hf_dirs, tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "q3k.gguf"
    write_gguf(hf_dirs("Qwen3ForCausalLM"), path, "F16")
    # Rewrite one tensor as Q3_K, a type we do not claim.
    writer = gguf.GGUFWriter(str(tmp_path / "mixed.gguf"), "qwen3")
    src = gguf.GGUFReader(str(path))
    for key, field in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in src.tensors:
        if t.name == "blk.0.ffn_up.weight":
            rows, cols = int(t.shape[1]), int(t.shape[0])
            blocks = np.random.default_rng(0).integers(0, 256, (rows, cols // 256 * 110), dtype=np.uint8)
            writer.add_tensor(t.name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q3_K)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"unsupported GGUF type Q3_K \(e\.g\. blk\.0\.ffn_up\.weight\)"):
        EngineConfig(model=str(tmp_path / "mixed.gguf")).finalize()


def test_bad_files_are_clear_errors(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        EngineConfig(model=str(bad)).finalize()
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x05" * 20)
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        EngineConfig(model=str(bad)).finalize()
    with pytest.raises(ConfigError, match="does not exist"):
        EngineConfig(model=str(tmp_path / "missing.gguf")).finalize()


def test_unsupported_architecture_is_named(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match="unsupported GGUF architecture 'gemma'"):
        EngineConfig(model=str(tmp_path / "g.gguf")).finalize()


def test_k_quant_test_blocks_stay_in_a_trained_models_range():
    """The random K-quant blocks the tests write dequantize to finite values of a sane spread."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        values = dequantize(random_k_blocks(qtype, 64, 512, np.random.default_rng(1)), qtype)
        assert np.isfinite(values).all() and 0.02 < values.std() < 0.3, qtype.name


def test_structured_outputs_compile_against_the_gguf_tokenizer(gguf_model):
    """The grammar compiler loads the tokenizer the way the frontend does: from the GGUF's metadata (it used
    AutoTokenizer on the .gguf path, which fails: issue 26)."""
    from engine import StructuredOutputsParams

    path = gguf_model("LlamaForCausalLM", "Q8_0")
    so = StructuredOutputsParams(choice=["yes", "no"])
    with LLM(str(path), dtype="float32", in_process=True, max_model_len=256, kv_cache_memory=8 << 20) as llm:
        out = llm.generate(["Rain?"], SamplingParams(temperature=0, max_tokens=8, structured_outputs=so),
                           use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no")
