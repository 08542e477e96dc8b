"""`ringserve serve [MODEL]`: the OpenAI-compatible server, with vLLM's flag names."""

from __future__ import annotations

import re
import sys

import click

from engine.config import (
    DEVICES,
    DTYPES,
    LOAD_FORMATS,
    SCHEDULING_POLICIES,
    ConfigError,
    EngineConfig,
    parse_size,
)
from frontend.chat_template import load_chat_template_source
from frontend.config import LOG_LEVELS, ServerConfig


class SizeParam(click.ParamType):
    """A token count or byte size: 4096, 32k, 1m, and (for bytes) 4GiB, 512MB, 2g."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = re.sub(r"(?i)(?<=[kmg])i?b$", "", str(value).strip())
        try:
            return parse_size(text)
        except ConfigError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeParam()


def _origins(ctx, param, values: tuple[str, ...]) -> list[str]:
    """--allowed-origins may repeat and may hold a comma-separated list."""
    return [origin.strip() for value in values for origin in value.split(",") if origin.strip()]


ENGINE_OPTIONS = [
    click.option("--tokenizer", default=None, help="Tokenizer directory (default: MODEL)."),
    click.option("--max-model-len", type=SIZE, default=None,
                 help="Context length in tokens, e.g. 4096 or 32k (default: the model's)."),
    click.option("--dtype", type=click.Choice(DTYPES), default="auto", help="Weight and activation dtype."),
    click.option("--seed", type=int, default=0, help="Seed of the engine's random state."),
    click.option("--tensor-parallel-size", "-tp", type=click.IntRange(min=1), default=1,
                 help="Executors (GPUs) the model is sharded over."),
    click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, help="Most requests in one batch."),
    click.option("--max-num-batched-tokens", type=SIZE, default=None,
                 help="Token budget of one engine step (default: 8192 on GPU, 2048 on CPU)."),
    click.option("--block-size", type=click.Choice(["1", "2", "4", "8", "16", "32", "64", "128"]), default="16",
                 help="Tokens per KV-cache block."),
    click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True,
                 help="Reuse the KV cache of shared prompt prefixes."),
    click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=0.9,
                 help="Fraction of GPU memory the engine may use."),
    click.option("--kv-cache-memory", type=SIZE, default=None,
                 help="KV-cache size in bytes, e.g. 4GiB (default on CPU: 4GiB; on GPU: from utilization)."),
    click.option("--enforce-eager", is_flag=True, help="Never capture CUDA graphs."),
    click.option("--load-format", type=click.Choice(LOAD_FORMATS), default="auto",
                 help="Weights: safetensors, or dummy (random) for benchmarks at real shapes."),
    click.option("--device", type=click.Choice(DEVICES), default="auto", help="Where the model runs."),
    click.option("--scheduling-policy", type=click.Choice(SCHEDULING_POLICIES), default="fcfs",
                 help="fcfs, or priority (the request's priority field; lower runs first)."),
    click.option("--long-prefill-token-threshold", type=SIZE, default=0,
                 help="Most tokens one prompt's prefill takes in a step (0: no cap), so that long prompts "
                      "share steps with other requests."),
    click.option("--max-logprobs", type=click.IntRange(min=0), default=20,
                 help="Most logprobs a request may ask for per token."),
]


def engine_options(command):
    """The engine's flags (vLLM's names), shared by `serve` and `generate`."""
    for option in reversed(ENGINE_OPTIONS):
        command = option(command)
    return command


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("model", required=False, default="")
@click.option("--host", default="127.0.0.1", help="Address to listen on (0.0.0.0: all interfaces).")
@click.option("--port", default=8000, type=click.IntRange(0, 65535), help="Port to listen on (0: any free port).")
@click.option("--api-key", envvar="RINGSERVE_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every route but /health (env RINGSERVE_API_KEY).")
@click.option("--served-model-name", default=None, help="The model name clients use (default: MODEL).")
@click.option("--chat-template", default=None, help="Chat template file, or the template itself.")
@click.option("--allowed-origins", multiple=True, callback=_origins,
              help="CORS origins allowed to call the API (repeat or comma-separate; '*' for any).")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=5.0,
              help="Seconds in-flight requests may finish after SIGTERM before they are aborted.")
@click.option("--enable-access-log", is_flag=True, help="Log one line per HTTP request.")
@click.option("--profile-dir", type=click.Path(file_okay=False), default=None,
              help="Enable /start_profile and /stop_profile, writing traces here.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", help="Log verbosity.")
@engine_options
def serve(model: str, **options) -> None:
    """Serve MODEL (a Hugging Face model directory) over an OpenAI-compatible HTTP API.

    Without MODEL, serves the built-in demo model (tiny, random weights, built on first use).
    """
    config = _server_config(model, options)
    from frontend.server import launch_server

    try:
        launch_server(config)
    except (ConfigError, OSError) as e:
        raise click.UsageError(str(e)) from None
    except Exception as e:  # the engine failed to start: say why in one line (the traceback under debug)
        if config.log_level == "debug":
            raise
        click.echo(f"error: the engine failed to start: {e}", err=True)
        sys.exit(1)


def _server_config(model: str, options: dict) -> ServerConfig:
    """The ServerConfig the flags describe, validated (bad values raise click.UsageError)."""
    # Clients name the model as the user typed it (as with vLLM), not as the absolute path finalize() makes.
    engine = engine_config(model, options, served_model_name=options["served_model_name"] or model or None)
    config = ServerConfig(
        host=options["host"], port=options["port"], api_key=options["api_key"],
        allowed_origins=options["allowed_origins"], chat_template=options["chat_template"],
        shutdown_timeout=options["shutdown_timeout"], enable_access_log=options["enable_access_log"],
        log_level=options["log_level"], profile_dir=options["profile_dir"], engine=engine,
    )
    try:
        config.validate()
        engine.finalize()
        if config.chat_template:
            load_chat_template_source(config.chat_template)
    except (ConfigError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    return config


def engine_config(model: str, options: dict, **extra) -> EngineConfig:
    """The EngineConfig that engine_options' flags describe (not yet finalized)."""
    return EngineConfig(
        model=model, tokenizer=options["tokenizer"], dtype=options["dtype"],
        max_model_len=options["max_model_len"], load_format=options["load_format"], seed=options["seed"],
        device=options["device"], tensor_parallel_size=options["tensor_parallel_size"],
        enforce_eager=options["enforce_eager"], block_size=int(options["block_size"]),
        enable_prefix_caching=options["enable_prefix_caching"],
        gpu_memory_utilization=options["gpu_memory_utilization"], kv_cache_memory=options["kv_cache_memory"],
        max_num_seqs=options["max_num_seqs"], max_num_batched_tokens=options["max_num_batched_tokens"],
        scheduling_policy=options["scheduling_policy"], max_logprobs=options["max_logprobs"],
        long_prefill_token_threshold=options["long_prefill_token_threshold"], **extra,
    )
