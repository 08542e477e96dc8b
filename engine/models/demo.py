"""The built-in demo model: a tiny random-weight Qwen3 model and a byte-level tokenizer, built on first use.

Nothing is downloaded. The tokenizer maps every byte to a token (plus ChatML's special tokens and a chat
template), the weights come from a fixed-seed generator, and the result is written once into a cache
directory ($RINGSERVE_CACHE, else ~/.cache/ringserve) under a name that changes whenever the recipe does.
Its text is gibberish: it exists so that a fresh machine can start the server and exercise every path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

RECIPE_VERSION = 2
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NUM_BYTE_TOKENS = 256
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": NUM_BYTE_TOKENS + 3,      # 256 bytes + 3 specials: every id decodes
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "bos_token_id": NUM_BYTE_TOKENS,
    "eos_token_id": NUM_BYTE_TOKENS + 2,
}


def cache_root() -> str:
    return os.environ.get("RINGSERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ringserve")


def ensure_demo_model(root: str | None = None) -> str:
    """The demo model's directory, built there on first use (atomically: safe when processes race)."""
    path = os.path.join(root or cache_root(), f"demo-model-v{RECIPE_VERSION}")
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".demo-build-", dir=os.path.dirname(path))
    try:
        _write_tokenizer(staging)
        _write_model(staging)
        try:
            os.rename(staging, path)
        except OSError:
            if not os.path.isfile(os.path.join(path, "model.safetensors")):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _write_tokenizer(directory: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(NUM_BYTE_TOKENS)}
    assert set(vocab) == set(alphabet)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    fast.save_pretrained(directory)


def _write_model(directory: str) -> None:
    import torch
    from safetensors.torch import save_file

    cfg = MODEL_CONFIG
    generator = torch.Generator().manual_seed(20261122)
    hidden, inter, head_dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_size = cfg["num_attention_heads"] * head_dim
    kv_size = cfg["num_key_value_heads"] * head_dim

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    tensors = {"model.embed_tokens.weight": normal(cfg["vocab_size"], hidden),
               "model.norm.weight": torch.ones(hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": normal(q_size, hidden),
            p + "self_attn.k_proj.weight": normal(kv_size, hidden),
            p + "self_attn.v_proj.weight": normal(kv_size, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, q_size),
            p + "self_attn.q_norm.weight": torch.ones(head_dim),
            p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
        })
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": [cfg["eos_token_id"]]}, f, indent=2)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which tokenizers' ByteLevel uses."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


if __name__ == "__main__":
    print(ensure_demo_model())
