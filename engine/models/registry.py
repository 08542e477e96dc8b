"""The model registry: every supported HF architecture maps to one model class."""

from __future__ import annotations

from engine.errors import ConfigError
from engine.models.bert import BertModel
from engine.models.encoder_args import ENCODER_ARCHITECTURES, EncoderArgs
from engine.models.llama import LlamaForCausalLM
from engine.models.model_args import SUPPORTED_ARCHITECTURES, ModelArgs

# The type the model runner sees (forward, compute_logits, num_layers, num_kv_heads, head_dim, dtype).
CausalLM = LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    # encoders: pooling models only (engine/executor/pooling_runner.py drives them)
    "BertModel": BertModel,
    "RobertaModel": BertModel,
    "XLMRobertaModel": BertModel,
}


def get_model_class(architecture: str) -> type[CausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise ConfigError(
            f"unsupported architecture {architecture!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES + ENCODER_ARCHITECTURES)}"
        ) from None


def model_args(hf: dict, architecture: str, max_model_len: int | None) -> ModelArgs | EncoderArgs:
    """The args a model class is built from: an encoder's (EncoderArgs) or a decoder's (ModelArgs)."""
    if architecture in ENCODER_ARCHITECTURES:
        return EncoderArgs.from_hf_config(hf, architecture)
    return ModelArgs.from_hf_config(hf, architecture, max_model_len)


__all__ = ["MODEL_REGISTRY", "BertModel", "CausalLM", "LlamaForCausalLM", "ModelArgs", "get_model_class", "model_args"]
