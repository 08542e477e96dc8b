"""`--speculative-config` / `LLM(speculative_config=...)`: vLLM's JSON for speculative decoding, model-free
methods only.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    {"method": "suffix", "num_speculative_tokens": 8}

Keys and defaults follow vLLM where vLLM has the key (prompt lookup defaults to 5..5 when neither bound is
given; suffix decoding's tree depth 24, 10,000 cached requests, spec factor 1.0, min token probability 0.1;
`disable_by_batch_size` turns speculation off while more requests run than that). Two differences: suffix
decoding drafts at most 8 tokens unless num_speculative_tokens says otherwise (vLLM: the tree depth; on a CPU
every draft is a row through all the weights), and disable_by_batch_size defaults to the crossover measured
on the CPU rather than to off. Two keys are ringserve's: `min_acceptance_rate` and `acceptance_window`, the
per-request draft length and switch (engine/core/speculator.py). Draft-model methods (eagle, mtp, draft models) are refused
with a ConfigError that names the key.
"""

from __future__ import annotations

import msgspec

from engine.errors import ConfigError

METHODS = ("ngram", "suffix")
# measured on the project's 2-core Zen 4 with SmolLM2-135M (docs/performance.md, "batch crossover"): past
# this many running requests a verify step costs more than its accepted tokens save
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
# measured alike: a verify row costs about this share of a batch-1 decode step
DEFAULT_MIN_ACCEPTANCE_RATE = 0.2


class SpeculativeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    method: str = "ngram"
    num_speculative_tokens: int | None = None     # most draft tokens a request verifies per step
    prompt_lookup_max: int | None = None          # ngram: longest n-gram matched against the history
    prompt_lookup_min: int | None = None          # ngram: shortest n-gram that may propose
    suffix_decoding_max_tree_depth: int = 24      # suffix: longest context + continuation a tree holds
    suffix_decoding_max_cached_requests: int = 10000   # suffix: finished requests' outputs kept (0: none)
    suffix_decoding_max_spec_factor: float = 1.0  # suffix: draft length <= factor x matched length
    suffix_decoding_min_token_prob: float = 0.1   # suffix: stop drafting below this estimated probability
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE   # None: never off for the batch
    # per request (engine/core/speculator.py): a draft token is verified only while its estimated chance
    # to be accepted stays at or above this (about what a verify row costs against a decode step on the CPU)
    min_acceptance_rate: float = DEFAULT_MIN_ACCEPTANCE_RATE
    acceptance_window: int = 32                   # checked draft positions the acceptance estimate spans

    def resolved(self) -> SpeculativeConfig:
        """Validated, with the defaults that depend on the method filled in; ConfigError names the key."""
        key = "speculative_config."
        if self.method not in METHODS:
            hint = " (draft-model methods are not supported)" if self.method else ""
            raise ConfigError(f"{key}method must be one of {', '.join(METHODS)}; got {self.method!r}{hint}")
        tokens = self.num_speculative_tokens
        if tokens is None:
            if self.method == "ngram":
                raise ConfigError(f"{key}num_speculative_tokens is required for method 'ngram'")
            tokens = min(self.suffix_decoding_max_tree_depth, 8)
        _positive(key + "num_speculative_tokens", tokens)
        if tokens > 32:
            raise ConfigError(f"{key}num_speculative_tokens must be at most 32, got {tokens}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if self.method == "ngram":
            if low is None and high is None:
                low = high = 5
            low = high if low is None else low
            high = low if high is None else high
            _positive(key + "prompt_lookup_min", low)
            _positive(key + "prompt_lookup_max", high)
            if low > high:
                raise ConfigError(f"{key}prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")
        elif low is not None or high is not None:
            raise ConfigError(f"{key}prompt_lookup_min/max apply to method 'ngram', not {self.method!r}")
        _positive(key + "suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth)
        if self.suffix_decoding_max_cached_requests < 0:
            raise ConfigError(f"{key}suffix_decoding_max_cached_requests must be >= 0, "
                              f"got {self.suffix_decoding_max_cached_requests}")
        if self.suffix_decoding_max_spec_factor <= 0:
            raise ConfigError(f"{key}suffix_decoding_max_spec_factor must be positive, "
                              f"got {self.suffix_decoding_max_spec_factor}")
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise ConfigError(f"{key}suffix_decoding_min_token_prob must be in [0, 1], "
                              f"got {self.suffix_decoding_min_token_prob}")
        if self.disable_by_batch_size is not None:
            _positive(key + "disable_by_batch_size", self.disable_by_batch_size)
        if not 0.0 <= self.min_acceptance_rate < 1.0:
            raise ConfigError(f"{key}min_acceptance_rate must be in [0, 1), got {self.min_acceptance_rate}")
        _positive(key + "acceptance_window", self.acceptance_window)
        return msgspec.structs.replace(self, num_speculative_tokens=tokens, prompt_lookup_min=low,
                                       prompt_lookup_max=high)


def parse_speculative_config(value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
    """A SpeculativeConfig from vLLM's JSON text, a dict (LLM's keyword) or a struct, resolved; None stays
    None. Unknown keys and wrong types are a ConfigError naming the key."""
    if value is None:
        return None
    try:
        if isinstance(value, str):
            value = msgspec.json.decode(value, type=SpeculativeConfig)
        elif isinstance(value, dict):
            value = msgspec.convert(value, SpeculativeConfig)
        elif not isinstance(value, SpeculativeConfig):
            raise ConfigError(f"speculative_config must be a JSON object, got {type(value).__name__}")
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ConfigError(f"speculative_config: {_name_the_key(str(e))}") from None
    return value.resolved()


def _name_the_key(message: str) -> str:
    """msgspec says 'Expected `int`, got `str` - at `$.num_speculative_tokens`': put the key first."""
    text, _, where = message.partition(" - at `$.")
    return f"{where.rstrip('`')}: {text}" if where else message


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
