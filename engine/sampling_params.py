"""SamplingParams: how one request is sampled and when it stops; PoolingParams: what a pooling request asks.

Field names and meanings follow vLLM's. The struct crosses process boundaries as msgpack, so it is a
msgspec Struct; it validates itself on construction and every error names the field. Fields that a model's
generation_config.json may supply (temperature, top_p, top_k, min_p, repetition_penalty) are None until
`resolved()` fills them, from the model's defaults first and the neutral values second.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

SAMPLING_EPS = 1e-5
MAX_STOP_STRINGS = 64
MAX_N = 128

# Limits on a structured-outputs spec (specs/structured-outputs-and-tools.md §4). The spec travels in the
# AddRequest's params, which must fit config.PARAMS_ALLOWANCE (64 KiB), and bounds what one request can
# make the scheduler's compile pool do.
MAX_SPEC_BYTES = 32 << 10          # json / grammar / structural_tag, as canonical JSON or text
MAX_REGEX_BYTES = 4 << 10
MAX_CHOICES = 256
MAX_CHOICE_BYTES = 1 << 10
MAX_JSON_DEPTH = 32                # nesting of the schema document itself
CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One request's output constraint, with vLLM's names: exactly one of json (a JSON schema, as a dict or
    its text), regex, choice, grammar (EBNF), json_object (any JSON object) or structural_tag (xgrammar's
    structural-tag JSON), plus the whitespace and additional-properties options of JSON schemas.

    Checked on construction for what needs no grammar backend: one constraint, types, sizes, nesting. The
    backend's own parse (invalid schema, regex, grammar; unsupported schema features) is
    `engine.structured_spec.validate`."""

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)]
        if len(given) > 1:
            raise ValueError("structured_outputs: you can only use one kind of structured outputs constraint "
                             f"but multiple are specified: {', '.join(given)}")
        if not given:
            raise ValueError("structured_outputs: no constraint is given; set one of "
                             + ", ".join(CONSTRAINT_FIELDS))
        _bool("structured_outputs.disable_any_whitespace", self.disable_any_whitespace)
        _bool("structured_outputs.disable_additional_properties", self.disable_additional_properties)
        kind = given[0]
        value = getattr(self, kind)
        name = f"structured_outputs.{kind}"
        if kind == "json_object":
            _bool(name, value)
        elif kind in ("json", "structural_tag"):
            if isinstance(value, str):
                _limit(name, value, MAX_SPEC_BYTES)
                try:
                    document = json.loads(value)
                except ValueError as e:
                    raise ValueError(f"{name} is not valid JSON: {e}") from None
            elif isinstance(value, dict):
                document = value
                _limit(name, self.spec_text, MAX_SPEC_BYTES)
            else:
                raise ValueError(f"{name} must be a JSON object or its text")
            if not isinstance(document, (dict, bool)):
                raise ValueError(f"{name} must be a JSON object (a schema), got {type(document).__name__}")
            _check_depth(name, document)
        elif kind == "regex":
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")
            _limit(name, value, MAX_REGEX_BYTES)
        elif kind == "grammar":
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty EBNF grammar")
            _limit(name, value, MAX_SPEC_BYTES)
        elif kind == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
                raise ValueError(f"{name} must be a non-empty list of strings")
            if len(value) > MAX_CHOICES:
                raise ValueError(f"{name} has {len(value)} items; at most {MAX_CHOICES} are allowed")
            for item in value:
                _limit(name, item, MAX_CHOICE_BYTES)

    @property
    def kind(self) -> str:
        """Which constraint is set: one of CONSTRAINT_FIELDS."""
        return next(name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False))

    @property
    def spec_text(self) -> str:
        """The constraint as one string (JSON documents canonicalised), the key of compiled grammars."""
        kind = self.kind
        value = getattr(self, kind)
        if kind in ("json", "structural_tag") and isinstance(value, str):
            value = json.loads(value)
        if isinstance(value, (dict, list)):
            return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        if isinstance(value, bool):
            return ""
        return value

    @property
    def key(self) -> tuple[str, str, bool, bool]:
        return (self.kind, self.spec_text, self.disable_any_whitespace, self.disable_additional_properties)

# Defaults taken from generation_config.json where a request leaves the field unset.
GENERATION_CONFIG_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None                 # 0 or -1: no top-k
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    max_tokens: int | None = 16              # None: until max_model_len
    min_tokens: int = 0
    logprobs: int | None = None              # top-k logprobs beside the sampled token's
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        _int("n", self.n, low=1, high=MAX_N)
        _num("temperature", self.temperature, low=0.0, high=None, optional=True)
        _num("top_p", self.top_p, low=0.0, high=1.0, optional=True, low_open=True)
        if self.top_k is not None:
            _int("top_k", self.top_k, low=-1)
            if self.top_k == -1:
                self.top_k = 0
        _num("min_p", self.min_p, low=0.0, high=1.0, optional=True)
        if self.seed is not None:
            _int("seed", self.seed, low=-(1 << 63), high=(1 << 64) - 1)
        _num("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        _num("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _num("repetition_penalty", self.repetition_penalty, low=0.0, high=None, optional=True, low_open=True)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError("stop must be a string or a list of strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
        if any(s == "" for s in self.stop):
            raise ValueError("stop must not contain empty strings")
        _int_list("stop_token_ids", self.stop_token_ids)
        _bool("ignore_eos", self.ignore_eos)
        if self.max_tokens is not None:
            _int("max_tokens", self.max_tokens, low=1)
        _int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})"
            )
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, low=0)
        if self.prompt_logprobs is not None:
            _int("prompt_logprobs", self.prompt_logprobs, low=0)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a mapping of token id to bias")
            for token, bias in self.logit_bias.items():
                _int("logit_bias token id", token, low=0)
                _num(f"logit_bias[{token}]", bias, low=-100.0, high=100.0)
        if self.allowed_token_ids is not None:
            _int_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty")
        _bool("skip_special_tokens", self.skip_special_tokens)
        _bool("include_stop_str_in_output", self.include_stop_str_in_output)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams")

    # ------------------------------------------------------------------ defaults
    def resolved(self, generation_defaults: dict | None = None) -> SamplingParams:
        """A copy with the generation-config fields filled: from the model's defaults, else neutral."""
        defaults = generation_defaults or {}
        updates = {}
        for name in GENERATION_CONFIG_FIELDS:
            if getattr(self, name) is None:
                value = defaults.get(name)
                updates[name] = NEUTRAL[name] if value is None else value
        if not updates:
            return self
        return msgspec.structs.replace(self, **updates)

    @property
    def is_resolved(self) -> bool:
        return all(getattr(self, name) is not None for name in GENERATION_CONFIG_FIELDS)

    @property
    def greedy(self) -> bool:
        return self.temperature is not None and self.temperature < SAMPLING_EPS

    def child(self, index: int) -> SamplingParams:
        """The params of the index-th of n parallel samples: n=1, and a distinct seed when seeded."""
        seed = None if self.seed is None else self.seed + index
        return msgspec.structs.replace(self, n=1, seed=seed)

    def validate_against(self, *, vocab_size: int, max_logprobs: int) -> None:
        """Checks that need the model: token ids in range, logprob counts under the engine's bound."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > max_logprobs:
                raise ValueError(f"{name} must be at most {max_logprobs}, got {value}")
        ids: list[tuple[str, int]] = [("stop_token_ids", t) for t in self.stop_token_ids]
        ids += [("allowed_token_ids", t) for t in self.allowed_token_ids or ()]
        ids += [("logit_bias", t) for t in self.logit_bias or ()]
        for name, token in ids:
            if not 0 <= token < vocab_size:
                raise ValueError(f"{name} holds token id {token}, outside the vocabulary [0, {vocab_size})")


def generation_defaults(generation_config: dict) -> dict:
    """The sampling defaults a model ships in generation_config.json, as SamplingParams field values."""
    out = {name: generation_config[name] for name in GENERATION_CONFIG_FIELDS if name in generation_config}
    if generation_config.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def _bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a boolean, got {value!r}")


def _limit(name: str, text: str, limit: int) -> None:
    size = len(text.encode())
    if size > limit:
        raise ValueError(f"{name} is {size} bytes; at most {limit} are allowed")


def _check_depth(name: str, document) -> None:
    """Refuse JSON documents nested deeper than MAX_JSON_DEPTH (iteratively: no recursion to exhaust)."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)


def _int(name: str, value, *, low: int | None = None, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")


def _int_list(name: str, value) -> None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{name} must be a list of integers")
    if any(v < 0 for v in value):
        raise ValueError(f"{name} must not hold negative token ids")


def _num(name: str, value, *, low: float | None, high: float | None = None, optional: bool = False,
         low_open: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        bound = "greater than" if low_open else "at least"
        raise ValueError(f"{name} must be {bound} {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value}")


class PoolingParams(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=False):
    """What a pooling request (an embedding) asks for, with vLLM's names.

    The engine pools the model's hidden states into one float32 vector per request (engine/models/
    pooler_config.py says how); what happens to it afterwards is per request and done by the client:
    `dimensions` keeps the first d components (Matryoshka models only), `normalize` L2-normalizes what is kept
    (default: the model's own Normalize module). `truncate_prompt_tokens` applies when the prompt is
    tokenized: -1 truncates to the model's max length, k to k tokens; without it a longer prompt is an error.
    """

    truncate_prompt_tokens: int | None = None
    dimensions: int | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        t = self.truncate_prompt_tokens
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or (t < 1 and t != -1)):
            raise ValueError(f"truncate_prompt_tokens must be -1 (the model's max length) or a positive "
                             f"integer, got {t!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"dimensions must be a positive integer, got {d!r}")
