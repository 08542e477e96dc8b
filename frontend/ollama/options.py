"""Ollama's `options` onto ringserve's sampling, and its context window onto the model's.

Acted on: temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty, presence_penalty,
frequency_penalty, num_ctx. Everything else (mirostat, num_gpu, num_thread, typical_p, ...) is ignored as
Ollama ignores names it does not know, and logged once per name so that a user can see what had no effect.
Unset options take the model's generation defaults, as on the OpenAI routes (not Ollama's own defaults).

The context is never silently cut: `num_ctx` above the model's context length, or a prompt that does not
fit in the context, is a 400 naming the field. `num_predict` past what the context leaves (or -1, -2: until
it is full) ends the answer at the context's end with done_reason "length"; it never shifts the context.
"""

from __future__ import annotations

import logging
from typing import Annotated

import msgspec
from msgspec import Meta

from engine.sampling_params import MAX_STOP_STRINGS
from frontend.chat.protocol import Penalty, Probability, StopString, TopP
from frontend.errors import from_validation_error, invalid

logger = logging.getLogger("ringserve.ollama")
_ignored_logged: set[str] = set()
MAX_IGNORED_LOGGED = 256          # distinct unknown names remembered (a hostile client could send millions)


class Options(msgspec.Struct, kw_only=True, omit_defaults=True):
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None             # 0 or -1: no top-k
    min_p: Probability | None = None
    seed: int | None = None
    num_predict: Annotated[int, Meta(ge=-2)] | None = None       # -1: until the context is full; -2: the same
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    num_ctx: Annotated[int, Meta(ge=1)] | None = None


KNOWN = frozenset(Options.__struct_fields__)
# The chat request's sampling fields, by option (for the ChatCompletionRequest the handlers build).
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty",
                   "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
# Chat field -> the Ollama name, for error messages.
FIELD_NAMES = {chat: f"options.{option}" for option, chat in SAMPLING_FIELDS.items()}
FIELD_NAMES["max_tokens"] = "options.num_predict"


def read_options(options: dict | None) -> Options:
    """The options ringserve acts on, checked (400 naming `options.NAME`); other names are logged once."""
    if not options:
        return Options()
    ignored = [name for name in options if name not in KNOWN]
    for name in ignored:
        if name not in _ignored_logged and len(_ignored_logged) < MAX_IGNORED_LOGGED:
            _ignored_logged.add(name)
            logger.warning("Ollama option %r is not supported and is ignored (logged once)", name[:64])
    try:
        return msgspec.convert({k: v for k, v in options.items() if k in KNOWN}, Options)
    except msgspec.ValidationError as e:
        error = from_validation_error(e)
        param = f"options.{error.param}" if error.param else "options"
        raise invalid(error.message.replace(f"(param {error.param})", f"(param {param})"), param) from None


def sampling_fields(options: Options) -> dict:
    """The chat request's sampling fields the options set (num_predict and num_ctx are applied per prompt)."""
    fields = {}
    for option, field in SAMPLING_FIELDS.items():
        value = getattr(options, option)
        if value is not None:
            fields[field] = [value] if option == "stop" and isinstance(value, str) else value
    if fields.get("top_k") == 0:
        fields["top_k"] = -1                          # Ollama's 0 is "no top-k", as is ours
    return fields


def output_budget(options: Options, prompt_len: int, max_model_len: int, default: int, prompt_param: str) -> int:
    """How many tokens the answer may take: num_predict within the context (num_ctx, at most the model's),
    else `default` within it. A prompt that leaves no room is a 400 naming the limit."""
    limit, param = max_model_len, prompt_param
    if options.num_ctx is not None:
        if options.num_ctx > max_model_len:
            raise invalid(f"options.num_ctx is {options.num_ctx}, above this model's maximum context length of "
                          f"{max_model_len} tokens", "options.num_ctx")
        limit, param = options.num_ctx, "options.num_ctx"
    room = limit - prompt_len
    if room <= 0:
        raise invalid(f"the prompt has {prompt_len} tokens, which leaves no room for an answer in a context of "
                      f"{limit} tokens ({param}); ringserve never truncates a prompt", param)
    wanted = options.num_predict
    if wanted is None:
        return min(default, room)
    if wanted == 0:
        raise invalid("options.num_predict must be positive, or -1 (until the context is full)",
                      "options.num_predict")
    return room if wanted < 0 else min(wanted, room)
