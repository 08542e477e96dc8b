"""What the server says while it starts, so that a first start (tens of seconds on a CPU) is never silent.

The frontend notes each step as it begins (resolving the model, the sampling defaults in force, starting
the engine, loading the tokenizer); the engine's processes add theirs (building the CPU kernels on first
use, loading the weights, sizing the KV cache, profiling and warming up on a GPU) on the same stderr in the
same format. The ready line then gives what a user checks first: the model, its dtype and quantization,
context length, KV-cache size in tokens, threads and the URL (and the web page's, once the app has one); for an
embedding model its pooling, dimensions and longest input instead of a context, and where embeddings are served.
"""

from __future__ import annotations

import logging

from engine.config import LOG_FORMAT, EngineConfig

logger = logging.getLogger("ringserve.server")


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    logging.getLogger("ringserve").setLevel(level.upper())


def note(message: str, *args) -> None:
    logger.info(message, *args)


def model_summary(config: EngineConfig) -> str:
    """'Q4_1 GGUF kept quantized (float16 activations), context 8192 tokens' for a finalized config."""
    stored = config.stored_weight_type()
    if stored and config.quantization == "gguf":
        weights = f"{stored} GGUF kept quantized ({config.resolved_dtype} activations)"
    else:
        weights = f"{config.resolved_dtype} (from a {stored} GGUF)" if stored else config.resolved_dtype
    if config.load_format in ("dummy", "fake"):
        weights += f", {config.load_format} weights"
    if config.runner == "pooling":
        pooler = config.pooler_config
        normalized = ", normalized" if pooler.normalize else ""
        return (f"{weights}, an embedding model ({pooler.pooling_type.lower()} pooling{normalized}, "
                f"{config.hidden_size} dimensions), inputs up to {config.max_model_len} tokens")
    return f"{weights}, context {config.max_model_len} tokens"


def ready_line(engine_client, url: str, web_page_path: str | None = None) -> str:
    """The line that says the server is up. It keeps 'serving NAME on URL' first: tests and tools find the
    URL there. `web_page_path`: the app's browser page, where it has one."""
    config: EngineConfig = engine_client.config
    tokens = (engine_client.num_blocks - 1) * config.block_size * config.data_parallel_size   # per engine: min
    parts = [model_summary(config)]
    if getattr(engine_client, "weight_bytes", None):
        parts.append(f"weights {describe_bytes(engine_client.weight_bytes)}")
    if config.load_format != "fake" and not config.is_encoder:     # an encoder keeps no KV cache
        parts.append(f"KV cache {tokens} tokens ({_size(tokens * config.kv_bytes_per_token())})")
    parts.append(f"{config.executor_threads} CPU threads per executor" if config.resolved_device == "cpu"
                 else f"{config.tensor_parallel_size * config.data_parallel_size} GPU(s)")
    if config.runner == "pooling":
        parts.append(f"embeddings at {url}/v1/embeddings (and /v1/score, /v1/rerank)")
    if web_page_path is not None:
        parts.append(f"chat in a browser at {url}{web_page_path}")
    return f"serving {config.model_name} on {url} | " + " | ".join(parts)


def models_ready_line(pool, config, url: str, web_page_path: str | None = None) -> str:
    """The ready line of a server with no MODEL argument: its models (comma-separated, in the place of the
    one model's name), none loaded yet."""
    limits = [f"--models-max {pool.max_loaded}"]
    if config.idle_unload:
        limits.append(f"--idle-unload {config.idle_unload:g} s")
    parts = [f"{len(pool.names)} models from {config.models_dir}, loaded on demand ({', '.join(limits)})"]
    if web_page_path is not None:
        parts.append(f"chat in a browser at {url}{web_page_path}")
    return f"serving {','.join(pool.names)} on {url} | " + " | ".join(parts)


def describe_bytes(sizes: dict[str, int]) -> str:
    """The ready line's weights: 'Q4_1 66.4 MB, Q8_0 30.1 MB, float16 0.1 MB (96.5 MB)'."""
    parts = [f"{kind} {count / 1e6:.1f} MB" for kind, count in sorted(sizes.items(), key=lambda kv: -kv[1])]
    return f"{', '.join(parts)} ({sum(sizes.values()) / 1e6:.1f} MB)"


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):.0f} MiB"
