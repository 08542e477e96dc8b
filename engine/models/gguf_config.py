"""A GGUF file's metadata as the Hugging Face config.json the rest of the engine reads.

llama.cpp names each hyperparameter `{arch}.{key}`; this maps the llama, qwen2 and qwen3 architectures onto
config.json's names, so that ModelArgs, EngineConfig and the tokenizer's EOS lookup read a GGUF model exactly
as they read a model directory. What the file does not state comes from its tensors (tied embeddings: no
`output.weight`; biases: present or not). Anything the decoder would compute differently is refused here,
naming the key: another architecture, RoPE scaling (linear, yarn, or llama3's `rope_freqs` table).
"""

from __future__ import annotations

from engine.errors import ConfigError
from engine.models.gguf_file import GGUFFile, read_gguf

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
FLOAT_TYPES = {0: "float32", 1: "float16", 30: "bfloat16"}
# The tensor types each checked against transformers token for token (tests/engine/models/test_gguf.py).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# The quantized types with matmul kernels (kernels/gguf_blocks.QUANT_TYPES; a test pins the two equal: the
# engine root reads this list without importing torch).
QUANTIZED_KERNEL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def gguf_hf_config(path: str) -> dict:
    """config.json's dict for the GGUF model at `path`."""
    gguf = read_gguf(path)
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"unsupported GGUF architecture {arch!r} in {path}; "
                          f"supported: {', '.join(ARCHITECTURES)}")

    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ConfigError(f"{path} lacks the metadata key {arch}.{name}")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) and meta.get(f"{arch}.rope.scaling.factor", 1.0) != 1.0:
        raise ConfigError(f"{path}: rope scaling {scaling!r} ({arch}.rope.scaling.type) is not supported")
    if "rope_freqs.weight" in gguf.tensors:
        raise ConfigError(f"{path} carries a rope_freqs table (llama3 rope scaling), which is not supported "
                          "for GGUF files yet; serve the model's safetensors directory instead")
    check_tensor_types(gguf)
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        raise ConfigError(f"{path} states no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)")
    head_dim = meta.get(f"{arch}.attention.key_length") or meta.get(f"{arch}.rope.dimension_count")
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv") or heads),
        "head_dim": int(head_dim or hidden // heads),
        "hidden_act": "silu",
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "mlp_bias": "blk.0.ffn_gate.bias" in gguf.tensors,
        "torch_dtype": _declared_dtype(gguf),
    }
    for name, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                        ("pad_token_id", "padding_token_id")):
        if f"tokenizer.ggml.{field}" in meta:
            config[name] = int(meta[f"tokenizer.ggml.{field}"])
    eot = meta.get("tokenizer.ggml.eot_token_id")
    if eot is not None and "eos_token_id" in config and eot != config["eos_token_id"]:
        config["eos_token_id"] = [config["eos_token_id"], int(eot)]     # llama.cpp stops at either
    return config


def holds_quantized_tensors(path: str) -> bool:
    """Whether the GGUF file at `path` has a matrix in a type with quantized kernels."""
    return any(t.type_name in QUANTIZED_KERNEL_TYPES for t in read_gguf(path).tensors.values())


def check_tensor_types(gguf: GGUFFile) -> None:
    """Refuse, before any weight is read, a file holding a tensor type we have not tested."""
    unsupported = {t.type_name: name for name, t in gguf.tensors.items() if t.type_name not in SUPPORTED_TYPES}
    if unsupported:
        kinds = ", ".join(f"{kind} (e.g. {name})" for kind, name in sorted(unsupported.items()))
        raise ConfigError(f"{gguf.path} holds tensors of unsupported GGUF type {kinds}; "
                          f"supported: {', '.join(SUPPORTED_TYPES)}")


def main_weight_type(path: str) -> str:
    """The tensor type holding most of the file's bytes (e.g. Q4_1), as the file's one-word description."""
    sizes: dict[str, int] = {}
    for tensor in read_gguf(path).tensors.values():
        sizes[tensor.type_name] = sizes.get(tensor.type_name, 0) + tensor.nbytes
    return max(sizes, key=sizes.__getitem__)


def _declared_dtype(gguf: GGUFFile) -> str:
    """The dtype the weights are in: F32, F16 or BF16 files keep theirs; quantized ones declare float16, as
    vLLM does for GGUF (finalize turns float16 into float32 on a CPU without kernels/cpu/ops)."""
    types = {t.type_id for name, t in gguf.tensors.items() if name.endswith(".weight") and len(t.shape) == 2}
    if len(types) == 1 and next(iter(types)) in FLOAT_TYPES:
        return FLOAT_TYPES[next(iter(types))]
    return "float16"
