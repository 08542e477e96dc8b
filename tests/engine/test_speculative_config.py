"""--speculative-config / LLM(speculative_config=...): vLLM's keys and defaults, and a ConfigError that names the
key at fault, raised before any process starts."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, parse_speculative_config
from engine.errors import ConfigError


def test_speculative_config_defaults_and_errors_name_the_key():
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}')
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (4, 4)
    spec = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3})
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)
    assert parse_speculative_config({"method": "suffix"}).num_speculative_tokens == 8
    for bad, key in [
        ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
         "prompt_lookup_min"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x/y"}, "model"),
        ({"method": "suffix", "suffix_decoding_min_token_prob": 2.0}, "suffix_decoding_min_token_prob"),
        ({"method": "suffix", "prompt_lookup_max": 3}, "prompt_lookup"),
    ]:
        with pytest.raises(ConfigError, match=key):
            parse_speculative_config(bad)
    with pytest.raises(ConfigError, match="speculative_config"):
        parse_speculative_config("{not json")


def test_llm_takes_vllms_dict_and_refuses_a_bad_one_before_starting():
    from engine import LLM

    config = EngineConfig(speculative_config={"method": "suffix", "num_speculative_tokens": 3}).finalize()
    assert config.speculative_config.num_speculative_tokens == 3
    assert EngineConfig.from_json(config.to_json()).speculative_config == config.speculative_config
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0})
    with pytest.raises(ConfigError, match="runner 'generate' only"):
        EngineConfig(runner="pooling", speculative_config={"method": "suffix"}).finalize()
