"""Writing tiny GGUF files for tests, the way llama.cpp's converter lays them out.

`write_gguf(hf_dir, path, qtype)` takes a tiny HF model directory (tests/engine/hf_models.make_tiny_model),
renames its tensors to llama.cpp's names, permutes a Llama model's q/k rows as llama.cpp does, stores every
matrix in `qtype` (norms and biases stay F32, as llama.cpp keeps them) and writes the metadata with
`gguf.GGUFWriter`, plus a byte-level GPT-2-style tokenizer with ChatML specials and a chat template.
Types that `gguf.quants` can quantize (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized with it;
for the K-quants, which it can only dequantize, each block is random bytes with its f16 scales set to
values that keep the weights near N(0, 0.1), which is a valid block of that type.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.models.demo import _bytes_to_unicode
from tests.engine.hf_models import make_tiny_model

ARCH_NAMES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "l l"]           # a few, as a BPE vocabulary has (the converter needs some)
VOCAB = 256 + len(MERGES) + len(SPECIALS)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Shapes whose rows are whole K-quant blocks (256 values) in every matrix.
GGUF_TINY = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=256, rope_scaling=None,
                 bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1)
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def permute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's order: per head, the two rotary halves interleaved row by row."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(qtype, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks of a K-quant type: random quants, scales chosen so values stay near N(0, 0.1)."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    block, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    f16 = lambda x: np.full((blocks.shape[0], 1), x, dtype=np.float16).view(np.uint8)  # noqa: E731
    if qtype in (T.Q4_K, T.Q5_K):        # d, dmin first; value = d*sc*q - dmin*m, sc and m in 0..63
        top = 15 if qtype == T.Q4_K else 31
        blocks[:, 0:2], blocks[:, 2:4] = f16(0.2 / (32 * top)), f16(0.1 * 0.5 / 32)
    elif qtype == T.Q6_K:                # d last; value = d*scale*(q - 32), scale int8
        blocks[:, -2:] = f16(0.2 / (64 * 32))
    else:
        raise ValueError(qtype)
    return blocks.reshape(rows, -1)


def write_gguf(hf_dir: Path, path: Path, qtype_name: str, seed: int = 0, metadata: dict | None = None,
               types: dict[str, str] | None = None) -> Path:
    """`metadata`: extra keys, e.g. {"general.sampling.temp": 0.6} (floats as float32, ints as uint32).
    `types` overrides qtype_name for the matrices whose GGUF name contains a key (e.g. {"attn_v": "Q8_0"}),
    as llama-quantize's mixes (Q4_K_M) store some tensors in another type."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from safetensors.numpy import load_file

    config = json.loads((hf_dir / "config.json").read_text())
    arch = ARCH_NAMES[config["architectures"][0]]
    qtype = T[qtype_name]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config["rope_theta"] if "rope_theta" in config
                              else config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(int(qtype) if qtype_name not in ("F32",) else 0)
    _add_tokenizer(writer)
    for key, value in (metadata or {}).items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    for name, value in sorted(tensors.items()):
        value = value.astype(np.float32)
        qtype = T[next((t for key, t in (types or {}).items() if key in gguf_name(name)), qtype_name)]
        if arch == "llama" and "q_proj" in name:
            value = permute_rotary_rows(value, config["num_attention_heads"])
        elif arch == "llama" and "k_proj" in name:
            value = permute_rotary_rows(value, config["num_key_value_heads"])
        if value.ndim == 1 or qtype == T.F32:
            writer.add_tensor(gguf_name(name), value)
        elif qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
            writer.add_tensor(gguf_name(name), random_k_blocks(qtype, *value.shape, rng), raw_dtype=qtype)
        else:
            data = gguf.quants.quantize(value, qtype)
            writer.add_tensor(gguf_name(name), data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer) -> None:
    byte_to_char = _bytes_to_unicode()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    merged = [m.replace(" ", "") for m in MERGES]
    writer.add_token_list([byte_to_char[b] for b in range(256)] + merged + SPECIALS)
    writer.add_token_types([1] * (256 + len(merged)) + [3] * len(SPECIALS))    # normal, then control tokens
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(VOCAB - 2)
    writer.add_eos_token_id(VOCAB - 1)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """One tiny HF model per architecture (fp32 safetensors), built on first use."""
    root, built = tmp_path_factory.mktemp("gguf-hf"), {}

    def get(arch: str):
        if arch not in built:
            # Llama: an untied LM head (output.weight); Qwen3: transformers reads no head_dim from a GGUF and
            # takes Qwen3's default of 128, as the real models have.
            extra = {"LlamaForCausalLM": {"tie_word_embeddings": False},
                     "Qwen3ForCausalLM": {"head_dim": 128}}.get(arch, {})
            built[arch] = make_tiny_model(arch, root / arch, **{**GGUF_TINY, **extra})
        return built[arch]

    return get


@pytest.fixture(scope="session")
def gguf_model(hf_dirs, tmp_path_factory):
    root, built = tmp_path_factory.mktemp("gguf"), {}

    def get(arch: str, qtype: str):
        if (arch, qtype) not in built:
            built[arch, qtype] = write_gguf(hf_dirs(arch), root / f"{arch}-{qtype}.gguf", qtype)
        return built[arch, qtype]

    return get
