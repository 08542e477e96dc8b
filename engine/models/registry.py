"""The model registry: every supported HF architecture maps to one model class."""

from __future__ import annotations

from engine.errors import ConfigError
from engine.models.llama import LlamaForCausalLM
from engine.models.model_args import SUPPORTED_ARCHITECTURES, ModelArgs

# The type the model runner sees (forward, compute_logits, num_layers, num_kv_heads, head_dim, dtype).
CausalLM = LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def get_model_class(architecture: str) -> type[CausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ConfigError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        ) from None


__all__ = ["MODEL_REGISTRY", "CausalLM", "LlamaForCausalLM", "ModelArgs", "get_model_class"]
