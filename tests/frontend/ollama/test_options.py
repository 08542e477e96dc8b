"""keep_alive durations and the options' context arithmetic, alone: Go durations and seconds, the context
never cut (a prompt that does not fit is a 400), num_predict bounded by what the context leaves."""

from __future__ import annotations

import math

import pytest

from frontend.errors import ApiError
from frontend.ollama.keep_alive import parse_keep_alive
from frontend.ollama.options import Options, output_budget, read_options, sampling_fields


@pytest.mark.parametrize("value, seconds", [
    (None, None), ("", None), (0, 0.0), ("0", 0.0), (300, 300.0), ("300", 300.0), (2.5, 2.5), ("5m", 300.0),
    ("1h30m", 5400.0), ("1.5h", 5400.0), ("300ms", 0.3), ("10s", 10.0), ("-1", math.inf), (-1, math.inf),
    ("-5m", math.inf), ("2h45m30s", 9930.0),
])
def test_keep_alive_reads_durations_and_seconds(value, seconds):
    assert parse_keep_alive(value) == pytest.approx(seconds) if seconds is not None else parse_keep_alive(value) is None


@pytest.mark.parametrize("value", ["5 minutes", "m", "5x", "1h 30m", "--5m", "nan", "5m3"])
def test_a_bad_keep_alive_is_a_400_naming_it(value):
    with pytest.raises(ApiError) as info:
        parse_keep_alive(value)
    assert info.value.status == 400 and info.value.param == "keep_alive"


def test_options_map_onto_sampling_fields():
    options = read_options({"temperature": 0, "top_k": 0, "stop": "END", "repeat_penalty": 1.1, "seed": 3,
                            "num_thread": 8})
    assert sampling_fields(options) == {"temperature": 0.0, "top_k": -1, "stop": ["END"],
                                        "repetition_penalty": 1.1, "seed": 3}
    with pytest.raises(ApiError) as info:
        read_options({"stop": [""]})
    assert info.value.param == "options.stop[0]"


def test_the_context_is_never_cut():
    assert output_budget(Options(), 100, 512, default=412, prompt_param="messages") == 412
    assert output_budget(Options(num_predict=50), 100, 512, 412, "messages") == 50
    assert output_budget(Options(num_predict=-2, num_ctx=200), 100, 512, 412, "messages") == 100
    assert output_budget(Options(num_predict=900, num_ctx=200), 100, 512, 412, "messages") == 100
    for options, param in ((Options(num_ctx=100), "options.num_ctx"), (Options(num_ctx=513), "options.num_ctx"),
                           (Options(), "messages")):
        with pytest.raises(ApiError) as info:
            output_budget(options, 100 if param != "messages" else 512, 512, 0, "messages")
        assert info.value.param == param
