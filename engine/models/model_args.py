"""The model's shape and feature flags, read from a Hugging Face config.json.

One decoder serves Llama, Mistral, Qwen2 and Qwen3; they differ only in the flags set here (qkv bias,
q/k norm, MLP bias, tied embeddings) and in their numbers. Anything the decoder cannot compute exactly
(another activation, another RoPE scaling, sliding-window attention that would actually slide) is a
ConfigError here, before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)

ROPE_TYPES = ("default", "llama3")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None         # None, or llama3 scaling parameters
    max_positions: int                # rows of the rotary table: the longest sequence served
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool                     # Qwen3: RMSNorm over each head of q and k before RoPE
    tie_word_embeddings: bool
    initializer_range: float          # std of dummy weights

    @classmethod
    def from_hf_config(cls, hf: dict, architecture: str, max_model_len: int | None = None) -> ModelArgs:
        """Parse config.json's dict as `architecture` (EngineConfig.architecture, which finalize() picks
        from the config's list); max_model_len (default: max_position_embeddings) bounds positions."""
        arch = architecture
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        missing = [k for k in REQUIRED_KEYS if k not in hf]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        activation = hf.get("hidden_act", "silu")
        if activation != "silu":
            raise ConfigError(f"hidden_act {activation!r} is not supported (only silu, i.e. SwiGLU)")
        max_positions = max_model_len or int(hf.get("max_position_embeddings") or 2048)
        _check_sliding_window(hf, max_positions)
        rope_theta, rope_scaling = _rope(hf)

        num_heads = int(hf["num_attention_heads"])
        attention_bias = bool(hf.get("attention_bias", False))
        qkv_bias = {"Qwen2ForCausalLM": True, "MistralForCausalLM": False}.get(arch, attention_bias)
        o_bias = attention_bias and arch in ("LlamaForCausalLM", "Qwen3ForCausalLM")
        return cls(
            architecture=arch,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_positions=max_positions,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=arch == "LlamaForCausalLM" and bool(hf.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )


def _rope(hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from either config.json layout: transformers 5's `rope_parameters`, or the older
    top-level `rope_theta` with `rope_scaling`."""
    params = hf.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind not in ROPE_TYPES:
        raise ConfigError(f"rope scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if kind == "default":
        return theta, None
    missing = [key for key in LLAMA3_ROPE_KEYS if key not in scaling]
    if missing:
        raise ConfigError(f"llama3 rope scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": "llama3", **{key: scaling[key] for key in LLAMA3_ROPE_KEYS}}


def _check_sliding_window(hf: dict, max_positions: int) -> None:
    """Full attention equals sliding-window attention while no sequence is longer than the window."""
    window = hf.get("sliding_window")
    enabled = hf.get("use_sliding_window", True) or "sliding_attention" in (hf.get("layer_types") or [])
    if window is not None and enabled and window < max_positions:
        raise ConfigError(
            f"the model uses sliding-window attention (window {window}), which is not supported; "
            f"serve it with max_model_len <= {window} so that the window never slides"
        )
