"""SamplingParams: validation names the field; resolved() fills model defaults, then neutral values."""

from __future__ import annotations

import msgspec
import pytest

from engine.sampling_params import NEUTRAL, SamplingParams, generation_defaults


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"n": 0}, "n must be at least 1"),
        ({"temperature": -0.1}, "temperature must be at least 0.0"),
        ({"top_p": 0.0}, "top_p must be greater than 0.0"),
        ({"top_k": -2}, "top_k must be at least -1"),
        ({"min_p": 1.5}, "min_p must be at most 1.0"),
        ({"presence_penalty": 3.0}, "presence_penalty must be at most 2.0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than 0.0"),
        ({"stop": [""]}, "stop must not contain empty strings"),
        ({"stop_token_ids": [-1]}, "stop_token_ids must not hold negative"),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"min_tokens": 5, "max_tokens": 4}, r"min_tokens \(5\) must be at most max_tokens \(4\)"),
        ({"logprobs": -1}, "logprobs must be at least 0"),
        ({"logit_bias": {3: 101.0}}, r"logit_bias\[3\] must be at most 100.0"),
        ({"allowed_token_ids": []}, "allowed_token_ids must not be empty"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"ignore_eos": 1}, "ignore_eos must be a boolean"),
    ],
)
def test_invalid_fields_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_stop_string_becomes_a_list_and_top_k_minus_one_means_off():
    params = SamplingParams(stop="###", top_k=-1)
    assert params.stop == ["###"] and params.top_k == 0


def test_resolved_takes_model_defaults_then_neutral_values():
    params = SamplingParams(top_p=0.5).resolved({"temperature": 0.6, "top_p": 0.9, "top_k": 20})
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.5, 20)
    assert (params.min_p, params.repetition_penalty) == (NEUTRAL["min_p"], NEUTRAL["repetition_penalty"])
    assert params.is_resolved
    assert not SamplingParams().is_resolved


def test_do_sample_false_in_generation_config_means_greedy():
    defaults = generation_defaults({"do_sample": False, "top_p": 0.8, "bos_token_id": 1})
    assert defaults == {"top_p": 0.8, "temperature": 0.0}
    assert SamplingParams().resolved(defaults).greedy


def test_child_params_get_distinct_seeds():
    params = SamplingParams(n=3, seed=10)
    assert [params.child(i).seed for i in range(3)] == [10, 11, 12]
    assert all(params.child(i).n == 1 for i in range(3))


def test_validate_against_the_model():
    SamplingParams(stop_token_ids=[5], logprobs=2).validate_against(vocab_size=6, max_logprobs=2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SamplingParams(stop_token_ids=[6]).validate_against(vocab_size=6, max_logprobs=2)
    with pytest.raises(ValueError, match="logprobs must be at most 2"):
        SamplingParams(logprobs=3).validate_against(vocab_size=6, max_logprobs=2)


def test_resolved_params_survive_msgpack():
    params = SamplingParams(max_tokens=7, stop_token_ids=[3], logit_bias={4: -1.5}).resolved()
    data = msgspec.msgpack.encode(params)
    assert msgspec.msgpack.decode(data, type=SamplingParams) == params
