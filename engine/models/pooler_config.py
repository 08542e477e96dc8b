"""How a pooling model turns hidden states into one vector: from its sentence-transformers files, or defaults.

A sentence-transformers model directory says it in three files (the reference implementation's layout):
`modules.json` lists the pipeline (Transformer, then Pooling, then optionally Normalize),
`<pooling path>/config.json` names the pooling mode (legacy `pooling_mode_*_token(s)` booleans or the newer
`pooling_mode` string), and `sentence_bert_config.json` holds `max_seq_length`. Without those files the
defaults are vLLM's: CLS for encoder models, the last token for decoders served with `--runner pooling`, both
normalized. A module the engine cannot run (a Dense projection, max pooling, several modes concatenated) is a
ConfigError naming it, never a silently different vector.
"""

from __future__ import annotations

import json
import os

import msgspec

from engine.errors import ConfigError

POOLING_TYPES = ("MEAN", "CLS", "LAST")
# sentence-transformers' names (legacy booleans and the `pooling_mode` strings) -> ours
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_lasttoken": "LAST",
             "cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens", "max", "mean_sqrt_len_tokens", "weightedmean")
_ST_PIPELINE = ("Transformer", "Pooling", "Normalize")


class PoolerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's --pooler-config: what one pooled vector is. None fields come from the model (finalize)."""

    pooling_type: str | None = None          # MEAN | CLS | LAST
    normalize: bool | None = None            # L2-normalize the pooled vector (sentence-transformers' Normalize)
    # Matryoshka models (config.json `matryoshka_dimensions` or `is_matryoshka`): the `dimensions` a request may
    # ask for; [] means none, None (with is_matryoshka) any up to the hidden size. Read from the model only.
    matryoshka_dimensions: list[int] | None = []


def resolve_pooler_config(model_dir: str | None, hf: dict, encoder: bool,
                          user: PoolerConfig | None) -> PoolerConfig:
    """The pooling of this model: the user's fields first, then its sentence-transformers files, then the
    defaults (CLS for encoders, LAST for decoders; normalized)."""
    files = read_sentence_transformers(model_dir) if model_dir and os.path.isdir(model_dir) else None
    pooling_type = (user.pooling_type if user else None) or (files[0] if files else None)
    pooling_type = (pooling_type or ("CLS" if encoder else "LAST")).upper()
    if pooling_type not in POOLING_TYPES:
        raise ConfigError(f"pooler_config.pooling_type must be one of {', '.join(POOLING_TYPES)}; "
                          f"got {pooling_type!r}")
    if not encoder and pooling_type != "LAST":
        raise ConfigError(f"pooling type {pooling_type} is not supported for decoder models (a causal model's "
                          "summary is its last token: LAST)")
    normalize = user.normalize if user and user.normalize is not None else (files[1] if files else True)
    dims = hf.get("matryoshka_dimensions")
    matryoshka = [int(d) for d in dims] if dims else (None if hf.get("is_matryoshka") else [])
    return PoolerConfig(pooling_type=pooling_type, normalize=normalize, matryoshka_dimensions=matryoshka)


def read_sentence_transformers(model_dir: str) -> tuple[str, bool] | None:
    """(pooling type, normalize) from modules.json and the Pooling module's config; None without modules.json."""
    modules = _read_json(os.path.join(model_dir, "modules.json"))
    if modules is None:
        return None
    pooling_type, normalize = None, False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _ST_PIPELINE:
            raise ConfigError(f"{model_dir}/modules.json has a {kind or 'nameless'} module "
                              f"({module.get('path')!r}); ringserve runs only {', '.join(_ST_PIPELINE)}")
        if kind == "Pooling":
            path = os.path.join(model_dir, module.get("path") or "", "config.json")
            pooling_type = _pooling_mode(_read_json(path) or {}, path)
        elif kind == "Normalize":
            normalize = True
    if pooling_type is None:
        raise ConfigError(f"{model_dir}/modules.json has no Pooling module")
    return pooling_type, normalize


def read_max_seq_length(model_dir: str | None) -> int | None:
    """sentence_bert_config.json's max_seq_length (what sentence-transformers truncates to), or None."""
    if not model_dir or not os.path.isdir(model_dir):
        return None
    config = _read_json(os.path.join(model_dir, "sentence_bert_config.json")) or {}
    value = config.get("max_seq_length")
    return int(value) if value else None


def _pooling_mode(config: dict, path: str) -> str:
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
    elif isinstance(modes, str):
        modes = [modes]
    unsupported = [m for m in modes if m in _ST_UNSUPPORTED or m not in _ST_MODES]
    if unsupported:
        raise ConfigError(f"{path}: pooling mode {', '.join(map(str, unsupported))} is not supported "
                          "(supported: mean, cls, lasttoken)")
    if len(modes) != 1:
        raise ConfigError(f"{path} asks for {len(modes)} pooling modes ({', '.join(modes) or 'none'}); "
                          "ringserve pools with exactly one")
    if config.get("include_prompt") is False:
        raise ConfigError(f"{path}: include_prompt false (pooling without the instruction prompt) is not supported")
    return _ST_MODES[modes[0]]


def _read_json(path: str):
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
