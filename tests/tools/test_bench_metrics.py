"""The metric definitions on hand-made records with exact timestamps (no server, no jitter)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tools.bench_client import RequestRecord
from tools.bench_metrics import calculate_metrics, format_result, parse_goodput
from tools.bench_serve import arrival_offsets

DURATION = 2.0


def _records() -> list[RequestRecord]:
    return [
        # 4 tokens: TTFT 100 ms, then one every 20 ms -> E2EL 160 ms, TPOT 60/3 = 20 ms, ITLs 20, 20, 20
        RequestRecord(
            prompt_len=10, start_time=0.0, token_times=[0.10, 0.12, 0.14, 0.16], output_tokens=4, success=True
        ),
        # one token: TTFT = E2EL = 200 ms; no TPOT in the statistics, TPOT 0 for goodput
        RequestRecord(prompt_len=20, start_time=0.05, token_times=[0.25], output_tokens=1, success=True),
        # failed after one fast chunk: in no statistic, no token count
        RequestRecord(
            prompt_len=30,
            start_time=0.06,
            token_times=[0.061],
            output_tokens=7,
            success=False,
            error="HTTP 500: boom",
        ),
    ]


def test_latency_metrics_follow_vllm_definitions():
    result = calculate_metrics(_records(), DURATION, 0.0, None, [50.0, 99.0])
    assert result.completed == 2 and result.failed == 1
    assert result.stats["ttft"].mean == pytest.approx(150.0)  # (100 + 200) / 2
    assert result.stats["tpot"].mean == pytest.approx(20.0)  # first token excluded, 1-token skipped
    assert result.stats["e2el"].mean == pytest.approx(180.0)  # (160 + 200) / 2
    assert sum(len(gaps) for i, gaps in enumerate(result.itls) if not result.errors[i]) == 3
    assert result.stats["itl"].mean == pytest.approx(20.0)
    assert result.stats["itl"].std == pytest.approx(0.0, abs=1e-9)
    assert result.stats["ttft"].percentiles == [(50.0, pytest.approx(150.0)), (99.0, pytest.approx(199.0))]


def test_token_counts_and_throughputs_cover_successful_requests_only():
    result = calculate_metrics(_records(), DURATION, 0.0, None, [99.0])
    assert result.total_input_tokens == 30
    assert result.total_output_tokens == 5
    assert result.output_lens == [4, 1, 0]
    assert result.request_throughput == pytest.approx(2 / DURATION)
    assert result.output_throughput == pytest.approx(5 / DURATION)
    assert result.total_token_throughput == pytest.approx(35 / DURATION)
    assert result.max_output_tokens_per_s == 5.0  # all 5 chunks within the first second
    assert result.max_concurrent_requests == 2  # [0, .16) and [.05, .25) overlap


def test_unreported_output_tokens_are_counted_from_the_text():
    class WordTokenizer:
        def __call__(self, texts, add_special_tokens):
            assert add_special_tokens is False
            return type("Encoding", (), {"input_ids": [t.split() for t in texts]})()

    record = RequestRecord(
        prompt_len=1, start_time=0.0, token_times=[0.1, 0.2], success=True, generated_text="one two three"
    )
    assert calculate_metrics([record], 1.0, 0.0, WordTokenizer(), [99.0]).output_lens == [3]
    # without a tokenizer: one token per token chunk
    assert calculate_metrics([record], 1.0, 0.0, None, [99.0]).output_lens == [2]


@pytest.mark.parametrize(
    "slos, good",
    [
        ({"ttft": 150}, 1),  # only the 100 ms TTFT
        ({"ttft": 200}, 2),  # an SLO is met at equality
        ({"tpot": 10}, 1),  # 20 ms fails; the 1-token request counts as TPOT 0
        ({"ttft": 1000, "e2el": 170}, 1),  # every SLO must hold
        ({"e2el": 50}, 0),
    ],
)
def test_goodput_counts_requests_meeting_every_slo(slos, good):
    result = calculate_metrics(_records(), DURATION, 0.0, None, [99.0], slos)
    assert result.request_goodput == pytest.approx(good / DURATION)


def test_no_goodput_without_slos():
    assert calculate_metrics(_records(), DURATION, 0.0, None, [99.0]).request_goodput is None


def test_result_json_has_vllm_keys_and_is_serialisable():
    result = calculate_metrics(_records(), DURATION, 0.0, None, [50.0, 99.9], {"ttft": 150})
    data = json.loads(json.dumps(result.to_dict()))
    for key in (
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_tpot_ms",
        "std_itl_ms",
        "p50_e2el_ms",
        "p99.9_ttft_ms",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "errors",
    ):
        assert key in data, key
    assert data["errors"] == ["", "", "HTTP 500: boom"]
    assert data["itls"][0] == pytest.approx([0.02, 0.02, 0.02])


def test_report_prints_vllm_lines():
    result = calculate_metrics(_records(), DURATION, 0.0, None, [90.0], {"ttft": 150})
    result.percentile_metrics = ["ttft", "e2el"]
    text = format_result(result)
    assert "Successful requests:                     2" in text
    assert "Request goodput (req/s):                 0.50" in text
    assert "P90 TTFT (ms):" in text and "Mean E2EL (ms):" in text
    assert "TPOT" not in text  # not among the selected metrics
    assert "HTTP 500: boom" in text  # the failure is shown


def test_empty_run_reads_zero():
    result = calculate_metrics([_records()[2]], DURATION, 0.0, None, [99.0])
    assert result.completed == 0 and result.stats["ttft"].mean == 0.0 and result.max_concurrent_requests == 0


@pytest.mark.parametrize("bad", ["ttft", "ttft:x", "speed:10", "ttft:-1"])
def test_bad_goodput_is_rejected_by_name(bad):
    with pytest.raises(ValueError, match="goodput SLO"):
        parse_goodput([bad])


def test_goodput_accepts_vllm_style_lists():
    assert parse_goodput(["ttft:200 tpot:50", "e2el:1000"]) == {"ttft": 200.0, "tpot": 50.0, "e2el": 1000.0}


def test_infinite_rate_sends_everything_at_once():
    assert not arrival_offsets(5, float("inf"), 1.0, np.random.default_rng(0)).any()


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (4.0, 0.5)])
def test_arrivals_are_gamma_spaced_and_end_at_n_over_rate(burstiness, cv):
    offsets = arrival_offsets(4000, 20.0, burstiness, np.random.default_rng(0))
    gaps = np.diff(offsets)
    assert (gaps >= 0).all()
    assert offsets[-1] == pytest.approx(4000 / 20.0)
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.06)  # Poisson: 1; gamma(k): 1/sqrt(k)


def test_arrivals_are_reproducible_and_even_at_infinite_burstiness():
    a = arrival_offsets(50, 10.0, 1.0, np.random.default_rng(7))
    assert np.array_equal(a, arrival_offsets(50, 10.0, 1.0, np.random.default_rng(7)))
    assert np.allclose(np.diff(arrival_offsets(5, 10.0, float("inf"), np.random.default_rng(0))), 0.1)


def test_bench_swap_times_the_first_token_not_the_role_preamble():
    """bench swap once passed True where send_request takes the endpoint's name: every chat stream was read as
    a completions stream, its role preamble (sent at once) counted as the first token, and a 1.6 s swap
    measured 0.24 s. The stub sends the preamble at once and the first token after 300 ms."""
    from tests.tools.stub_openai_server import StubOpenAIServer
    from tools.bench_client import send_request
    from tools.bench_swap import first_token

    with StubOpenAIServer(ttft_ms=300, itl_ms=1) as stub:
        assert 0.3 <= first_token(stub.url, "stub-model", 2) < 5
    with pytest.raises(ValueError, match="endpoint must be"):
        asyncio.run(send_request(None, "http://127.0.0.1:9", b"{}", 0, True, 1.0))
