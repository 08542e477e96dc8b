"""The default sampling parameters: what a request that leaves a field unset is sampled with.

As in vLLM, `generation_config` picks where the defaults come from: "auto" (the model's own: its
generation_config.json, or the `general.sampling.*` keys of a GGUF file), "vllm" (none: the neutral values,
temperature 1.0 and no truncation), or a path (a folder holding a generation_config.json, or the file
itself); `override_generation_config` then sets fields on top of either. The fields are vLLM's: temperature,
top_p, top_k, min_p, repetition_penalty and max_new_tokens (as max_tokens). A request's own values always
win over these defaults.

One difference from vLLM, for GGUF files under "auto": the fields that the file does not set take
llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), since GGUF models come from
llama.cpp and Ollama, whose users expect them, and most GGUF files carry no sampling keys at all; plain
temperature 1.0 made a small model ramble to the end of its context.
"""

from __future__ import annotations

import json
import os

import msgspec

from engine.errors import ConfigError
from engine.sampling_params import GENERATION_CONFIG_FIELDS, SamplingParams, generation_defaults

MODES = ("auto", "vllm")
FILE_NAME = "generation_config.json"
LLAMA_CPP_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# GGUF metadata keys of a model's recommended sampling (llama.cpp's `general.sampling.*`), by our names
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_repeat": "repetition_penalty"}
OVERRIDE_FIELDS = (*GENERATION_CONFIG_FIELDS, "max_new_tokens", "do_sample")


class SamplingDefaults(msgspec.Struct, kw_only=True):
    """The defaults in force (SamplingParams field names; max_tokens only when the config sets it) and a
    short account of where they came from, for the startup line."""

    values: dict[str, float | int] = {}
    source: str = ""

    def describe(self) -> str:
        shown = ", ".join(f"{name} {value:g}" for name, value in self.values.items())
        return f"{shown or 'none, so temperature 1 and no top-k/top-p/min-p'} ({self.source})"


def check_mode(generation_config: str) -> None:
    """Refuse a --generation-config that is neither a mode nor an existing folder or file."""
    if generation_config not in MODES and not os.path.exists(os.path.expanduser(generation_config)):
        raise ConfigError(f"generation_config must be 'auto', 'vllm' or a folder holding {FILE_NAME}; "
                          f"{generation_config!r} is none of these")


def sampling_defaults(model: str, is_gguf: bool, generation_config: str = "auto",
                      override: dict | None = None) -> SamplingDefaults:
    """The defaults for `model` (a local directory or GGUF file) under vLLM's two options."""
    check_mode(generation_config)
    override = override or {}
    unknown = sorted(set(override) - set(OVERRIDE_FIELDS))
    if unknown:
        raise ConfigError(f"override_generation_config: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(OVERRIDE_FIELDS)}")
    if generation_config == "vllm":
        values, source = {}, "--generation-config vllm"
    elif generation_config != "auto":
        values, source = _from_json(_json_path(generation_config)), f"from {generation_config}"
    elif is_gguf:
        stated = gguf_sampling(model)
        values = {**LLAMA_CPP_DEFAULTS, **stated}
        source = ("the GGUF file's, the rest llama.cpp's" if stated
                  else "llama.cpp's: the GGUF file states none; --generation-config vllm for neutral ones")
    else:
        path = os.path.join(model, FILE_NAME)
        values = _from_json(path) if os.path.isfile(path) else {}
        source = "the model's generation_config.json" if values else "the model states none"
    if override:
        values = {**values, **_as_sampling_fields(override)}
        source += ", with --override-generation-config"
    _validate(values)
    return SamplingDefaults(values=values, source=source)


def gguf_sampling(path: str) -> dict:
    """The sampling a GGUF file recommends in its `general.sampling.*` metadata (often nothing)."""
    from engine.models.gguf_file import read_gguf

    metadata = read_gguf(path).metadata
    return {name: metadata[key] for key, name in GGUF_SAMPLING_KEYS.items() if key in metadata}


def _json_path(location: str) -> str:
    location = os.path.expanduser(location)
    path = os.path.join(location, FILE_NAME) if os.path.isdir(location) else location
    if not os.path.isfile(path):
        raise ConfigError(f"generation_config {location!r} holds no {FILE_NAME}")
    return path


def _from_json(path: str) -> dict:
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return _as_sampling_fields(document)


def _as_sampling_fields(config: dict) -> dict:
    """A generation config's sampling fields under SamplingParams' names (do_sample false: greedy)."""
    values = generation_defaults(config)
    if config.get("max_new_tokens") is not None:
        values["max_tokens"] = config["max_new_tokens"]
    return {name: value for name, value in values.items() if value is not None}


def _validate(values: dict) -> None:
    try:
        SamplingParams(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"default sampling parameters: {e}") from None
