"""What Ollama's model routes say about the served model: /api/tags, /api/show, /api/ps.

Built once from the engine's config: the model's name (never where its files live), its format, family,
parameter count and quantization, its context length under model_info's "<family>.context_length" (which
clients such as VS Code's read for the context window), and its capabilities ("completion", "tools" when
tool calls are parsed, "thinking" with a reasoning parser, "embedding" for a pooling model). The digest
identifies the model by name and path; it is not a hash of the weights (that would read them all).
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timezone

from engine.config import EngineConfig
from frontend.serving_engine import ServingContext

OLLAMA_API_VERSION = "0.12.6"    # the Ollama release whose API these routes follow; clients check it


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class ModelCard:
    """The served model, in Ollama's words."""

    def __init__(self, ctx: ServingContext, weight_bytes: int):
        self.describe(ctx.engine.config, ctx.model_name, weight_bytes)
        config = ctx.engine.config
        server = ctx.config
        self.pooling = config.runner == "pooling" or config.is_encoder
        capabilities = ["embedding"] if self.pooling else ["completion"]
        if server.tool_call_parser and server.enable_auto_tool_choice and not self.pooling:
            capabilities.append("tools")
        if server.reasoning_parser and not self.pooling:
            capabilities.append("thinking")
        self.capabilities = capabilities
        self.template = ctx.chat_template.source if ctx.chat_template is not None else ""
        self.defaults = ctx.generation_defaults

    @classmethod
    def listing(cls, config: EngineConfig, name: str) -> ModelCard:
        """The card of a served model as /api/tags and /api/ps list it (no template, defaults, capabilities:
        those need the model's tokenizer, which a model not yet used has not loaded)."""
        card = cls.__new__(cls)
        card.describe(config, name, 0)
        return card

    def describe(self, config: EngineConfig, name: str, weight_bytes: int) -> None:
        """What the model's files and config say: name, size, digest, details."""
        self.name = name
        self.max_model_len = config.max_model_len
        try:
            hf = config.hf_config()
        except Exception:     # a model description that cannot be read again: say less, serve anyway
            hf = {}
        self.family = str(hf.get("model_type") or config.architecture or "unknown")
        self.parameters = _parameter_count(hf)
        self.hidden_size = hf.get("hidden_size")
        self.size = weight_bytes or _files_size(config.model)
        self.digest = hashlib.sha256(f"{self.name}\0{config.model}".encode()).hexdigest()
        self.modified_at = rfc3339(datetime.fromtimestamp(_mtime(config.model), timezone.utc))
        stored = config.stored_weight_type()
        self.details = {
            "parent_model": "", "format": "gguf" if config.is_gguf else "safetensors", "family": self.family,
            "families": [self.family], "parameter_size": _human(self.parameters),
            "quantization_level": stored or {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(
                config.resolved_dtype, config.resolved_dtype.upper()),
        }
        self.on_gpu = config.resolved_device == "cuda"

    def matches(self, model: str) -> bool:
        """Ollama clients name a model with its tag; "NAME:latest" is this server's NAME."""
        return model == self.name or model == f"{self.name}:latest"

    def listed(self) -> dict:
        """An /api/tags entry."""
        return {"name": self.name, "model": self.name, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}

    def running(self, expires_at: datetime) -> dict:
        """An /api/ps entry."""
        return {"name": self.name, "model": self.name, "size": self.size, "digest": self.digest,
                "details": self.details, "expires_at": rfc3339(expires_at),
                "size_vram": self.size if self.on_gpu else 0, "context_length": self.max_model_len}

    def shown(self) -> dict:
        """/api/show's answer."""
        info = {"general.architecture": self.family, f"{self.family}.context_length": self.max_model_len}
        if self.parameters:
            info["general.parameter_count"] = self.parameters
        if self.hidden_size:
            info[f"{self.family}.embedding_length"] = self.hidden_size
        parameters = "\n".join(f"{_PARAMETER_NAMES.get(k, k)} {v}" for k, v in sorted(self.defaults.items())
                               if k in _PARAMETER_NAMES)
        modelfile = f"# served by ringserve\nFROM {self.name}\n" + "".join(
            f"PARAMETER {line}\n" for line in parameters.splitlines())
        return {"modelfile": modelfile, "parameters": parameters, "template": self.template,
                "details": self.details, "model_info": info, "capabilities": self.capabilities,
                "modified_at": self.modified_at}


_PARAMETER_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "repetition_penalty": "repeat_penalty", "max_tokens": "num_predict"}


def _parameter_count(hf: dict) -> int:
    """A Llama-family decoder's parameters from its config (0 when the config does not say enough)."""
    try:
        hidden, layers = int(hf["hidden_size"]), int(hf["num_hidden_layers"])
        vocab, inner = int(hf["vocab_size"]), int(hf["intermediate_size"])
        heads = int(hf["num_attention_heads"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        head_dim = int(hf.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return 0
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    per_layer = attention + 3 * hidden * inner + 2 * hidden
    embeddings = vocab * hidden * (1 if hf.get("tie_word_embeddings", True) else 2)
    return layers * per_layer + embeddings + hidden


def _human(count: int) -> str:
    if not count:
        return ""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}" if count < 10 * size else f"{count / size:.0f}{unit}"
    return str(count)


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except (OSError, TypeError):
        return 0.0


def _files_size(path: str) -> int:
    if not path or not os.path.exists(path):
        return 0
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path)
               if name.endswith((".safetensors", ".bin", ".gguf")))
