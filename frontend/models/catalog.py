"""Which models a server serves, and each one's settings.

With `--models-dir DIR`, every GGUF file in DIR is a model named by its stem, and every directory in DIR that
holds a config.json is a model named by the directory's name; a MODEL argument beside it is one more (and
the one the server loads at start). Each model's serve flags and sampling defaults are layered, later over
earlier:

1. the model's own defaults (its config.json or GGUF metadata, its generation config);
2. the command line's flags;
3. DIR/models.toml: its top-level keys for every model in DIR, then its [NAME] table for model NAME;
4. the file beside the model: NAME.toml next to NAME.gguf, or ringserve.toml inside the model's directory;

and a request's own fields over all of them. Keys are the flags' names with underscores: engine settings
(max_model_len, dtype, kv_cache_memory, ...), the chat settings (chat_template, tool_call_parser,
reasoning_parser, ...), and sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty,
max_new_tokens). An unknown key or a bad value stops the server at start, naming the file and the key.
"""

from __future__ import annotations

import logging
import os
import tomllib

import msgspec

from engine.config import ConfigError
from engine.sampling_params import GENERATION_CONFIG_FIELDS
from frontend.config import ServerConfig

logger = logging.getLogger("ringserve.models")

DIRECTORY_SETTINGS = "models.toml"
MODEL_DIRECTORY_SETTINGS = "ringserve.toml"
ENGINE_SETTINGS = ("max_model_len", "dtype", "quantization", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens",
                   "block_size", "enable_prefix_caching", "tensor_parallel_size", "data_parallel_size", "runner",
                   "generation_config", "cpu_threads", "load_format", "seed", "tokenizer", "max_logprobs",
                   "enforce_eager", "gpu_memory_utilization", "scheduling_policy", "long_prefill_token_threshold")
SERVER_SETTINGS = ("chat_template", "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser",
                   "reasoning_field", "default_chat_template_kwargs", "exclude_tools_when_tool_choice_none")
SAMPLING_SETTINGS = (*GENERATION_CONFIG_FIELDS, "max_new_tokens")      # --override-generation-config's


class Catalog(msgspec.Struct):
    """The served models, each with its whole configuration, and the one the server loads at start."""

    models: dict[str, ServerConfig]
    start_model: str | None             # the MODEL argument's name, if one was given


def model_files(directory: str) -> dict[str, str]:
    """name -> path of every model in `directory`: GGUF files by stem, config.json directories by name."""
    if not os.path.isdir(directory):
        raise ConfigError(f"--models-dir {directory!r} is not a directory")
    found: dict[str, str] = {}
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_file() and entry.name.lower().endswith(".gguf"):
            name = entry.name[:-len(".gguf")]
        elif entry.is_dir() and os.path.isfile(os.path.join(entry.path, "config.json")):
            name = entry.name
        else:
            continue
        if name in found:
            logger.warning("models dir: %s and %s are both named %s; serving the first", found[name], entry.path, name)
            continue
        found[name] = os.path.abspath(entry.path)
    return dict(sorted(found.items()))


def read_settings(path: str) -> dict:
    """A settings file's table ({} when there is none)."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None


def with_settings(config: ServerConfig, settings: dict, source: str) -> ServerConfig:
    """`config` with `settings` (one layer: engine, chat and sampling keys) applied over it."""
    allowed = (*ENGINE_SETTINGS, *SERVER_SETTINGS, *SAMPLING_SETTINGS)
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise ConfigError(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(allowed)}")
    if not settings:
        return config
    engine = msgspec.to_builtins(config.engine)
    engine.update({k: v for k, v in settings.items() if k in ENGINE_SETTINGS})
    sampling = {k: v for k, v in settings.items() if k in SAMPLING_SETTINGS}
    engine["override_generation_config"] = {**engine.get("override_generation_config", {}), **sampling}
    server = msgspec.to_builtins(config)
    server.update({k: v for k, v in settings.items() if k in SERVER_SETTINGS})
    server["engine"] = engine
    try:
        return msgspec.convert(server, ServerConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {e}") from None


def catalog(config: ServerConfig) -> Catalog:
    """Every model the server serves, each configuration finalized (a model whose files cannot be served
    is left out with a warning naming why; a bad settings file stops the server)."""
    models: dict[str, ServerConfig] = {}
    start = None
    directory = config.models_dir
    table = read_settings(os.path.join(directory, DIRECTORY_SETTINGS)) if directory else {}
    shared = {k: v for k, v in table.items() if not isinstance(v, dict) or k in SERVER_SETTINGS}
    per_model = {k: v for k, v in table.items() if k not in shared}
    where = os.path.join(directory or "", DIRECTORY_SETTINGS)
    flags = config.engine_flags or config.engine      # the engine flags as given, before any finalize()
    if config.engine.model or not directory:
        start = config.engine.model_name
        own = per_model.get(start, {})
        beside = read_settings(_beside(config.engine.model)) if os.path.exists(config.engine.model) else {}
        if own or beside:
            model = msgspec.structs.replace(config, engine=msgspec.structs.replace(flags))
            model = with_settings(model, own, f"{where} [{start}]")
            models[start] = _finalized(with_settings(model, beside, _beside(config.engine.model)))
        else:
            models[start] = _finalized(config)
    if directory:
        engine = msgspec.structs.replace(flags, model="", served_model_name=None, tokenizer=None, revision=None)
        template = with_settings(msgspec.structs.replace(config, engine=engine), shared, where)
        for name, path in model_files(directory).items():
            if name in models:
                logger.warning("models dir: %s has the name of the MODEL argument; serving the argument", path)
                continue
            engine = msgspec.structs.replace(template.engine, model=path, served_model_name=name)
            layered = with_settings(msgspec.structs.replace(template, engine=engine), per_model.get(name, {}),
                                    f"{where} [{name}]")
            beside = _beside(path)
            layered = with_settings(layered, read_settings(beside), beside)
            try:
                models[name] = _finalized(layered)
            except (ConfigError, ValueError, OSError) as e:
                logger.warning("models dir: not serving %s: %s", name, e)
        unknown = sorted(set(per_model) - set(models))
        if unknown:
            raise ConfigError(f"{where}: tables for models that are not in {directory}: {', '.join(unknown)}")
    if not models:
        raise ConfigError(f"--models-dir {directory!r} holds no model (GGUF files, or directories with a "
                          "config.json) and no MODEL was given")
    return Catalog(models=models, start_model=start)


def _beside(model: str) -> str:
    """The settings file of one model: NAME.toml beside NAME.gguf, ringserve.toml inside a directory."""
    if os.path.isdir(model):
        return os.path.join(model, MODEL_DIRECTORY_SETTINGS)
    return os.path.splitext(model)[0] + ".toml"


def _finalized(config: ServerConfig) -> ServerConfig:
    config.validate()
    config.engine.finalize()
    return config
