"""Loading the tokenizer and the model's EOS ids, shared by the frontend and `LLM`."""

from __future__ import annotations

import os

from engine.config import EngineConfig


def load_tokenizer(config: EngineConfig):
    """The fast Hugging Face tokenizer of config.tokenizer_path (no download: local files only).

    A GGUF file carries its tokenizer and chat template; transformers' GGUF converter builds the fast
    tokenizer from them. It is asked directly (PreTrainedTokenizerFast) rather than through AutoTokenizer,
    which would first parse the whole file again for a config it does not need (seconds to tens of seconds
    for a 50k-token vocabulary); the result is the same tokenizer class either way.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = config.tokenizer_path
    try:
        if path.lower().endswith(".gguf"):
            directory, name = os.path.split(path)
            return PreTrainedTokenizerFast.from_pretrained(directory, gguf_file=name, local_files_only=True)
        return AutoTokenizer.from_pretrained(path, use_fast=True, local_files_only=True)
    except Exception as e:  # transformers raises many types here; the user needs the path and the reason
        raise ValueError(f"cannot load a tokenizer from {config.tokenizer_path!r}: {e}") from None


def eos_token_ids(config: EngineConfig, tokenizer=None) -> list[int]:
    """EOS ids: generation_config.json's eos_token_id (int or list), else the tokenizer's."""
    ids = config.model_generation_config().get("eos_token_id")
    if ids is None:
        ids = config.hf_config().get("eos_token_id")
    if ids is None and tokenizer is not None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return sorted({int(i) for i in (ids if isinstance(ids, list) else [ids])})

