"""The encoder's shape, read from a Hugging Face config.json: BERT and the models that share its layout.

BertModel, RobertaModel and XLMRobertaModel are one network (engine/models/bert.py): learned absolute
positions, post-LayerNorm blocks, a GELU MLP. They differ in numbers and in where positions start: RoBERTa
counts them from `pad_token_id + 1` (HF's create_position_ids_from_input_ids on an unpadded sequence), so its
max_position_embeddings of 514 serves 512 tokens. Anything the encoder cannot compute exactly (relative
position embeddings, another activation) is a ConfigError here, before any weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError

ENCODER_ARCHITECTURES = ("BertModel", "RobertaModel", "XLMRobertaModel")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings")


@dataclass(frozen=True)
class EncoderArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    layer_norm_eps: float
    hidden_act: str
    max_positions: int                # rows of the position table
    position_offset: int              # the first token's position id (RoBERTa: pad_token_id + 1)
    type_vocab_size: int
    initializer_range: float          # std of dummy weights
    tie_word_embeddings: bool = False # (read by the loader; an encoder has no LM head)

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    @property
    def max_len(self) -> int:
        """The longest sequence the position table serves."""
        return self.max_positions - self.position_offset

    @classmethod
    def from_hf_config(cls, hf: dict, architecture: str) -> EncoderArgs:
        if architecture not in ENCODER_ARCHITECTURES:
            raise ConfigError(f"{architecture!r} is not an encoder architecture "
                              f"({', '.join(ENCODER_ARCHITECTURES)})")
        missing = [k for k in REQUIRED_KEYS if k not in hf]
        if missing:
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        position_type = hf.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ConfigError(f"position_embedding_type {position_type!r} is not supported (only absolute)")
        activation = hf.get("hidden_act", "gelu")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {activation!r} is not supported ({', '.join(ACTIVATIONS)})")
        hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        roberta = architecture in ("RobertaModel", "XLMRobertaModel")
        offset = int(hf.get("pad_token_id", 1)) + 1 if roberta else 0
        args = cls(
            architecture=architecture,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            head_dim=hidden // heads,
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            hidden_act=activation,
            max_positions=int(hf["max_position_embeddings"]),
            position_offset=offset,
            type_vocab_size=int(hf.get("type_vocab_size", 2)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
        )
        if args.max_len < 1:
            raise ConfigError(f"max_position_embeddings {args.max_positions} leaves no positions after the "
                              f"offset of {offset}")
        return args
