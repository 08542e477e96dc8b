"""The runner against a stub server with known delays: the figures match the server's own timings.

Both sides stamp time.perf_counter() in one process, so each client figure is bounded below exactly by
the server's timestamps (the client sends before the server receives, and receives after it writes)
and above by the same plus a tolerance for scheduling jitter. The delays are picked so that a wrong
definition misses by a clear margin: with TTFT 60 ms and ITL 12 ms over 5 tokens, TPOT is 12 ms,
while E2EL / tokens (first token included) would be ~22 ms and (E2EL - TTFT) / tokens ~9.6 ms; [DONE]
comes 40 ms after the last token, so E2EL measured to [DONE] would be off by 40 ms.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import shared_path
from tests.tools.stub_openai_server import TOKEN_TEXT, StubOpenAIServer
from tools.bench_datasets import SampleRequest
from tools.bench_serve import BenchError, BenchSettings, cli, format_result, run_benchmark

TTFT_MS, ITL_MS, DONE_DELAY_MS, SLOW_TTFT_MS = 60.0, 12.0, 40.0, 250.0
TOKENS = 5
JITTER_MS = 15.0  # a typical request's client-side overhead on a busy 2-core machine
MEDIAN_TOL_MS = 1.5  # for per-token figures, whose jitter divides over the tokens


@pytest.fixture
def stub():
    with StubOpenAIServer(
        ttft_ms=TTFT_MS, itl_ms=ITL_MS, slow_ttft_ms=SLOW_TTFT_MS, done_delay_ms=DONE_DELAY_MS
    ) as server:
        yield server


def _requests(modes: list[str], tokens: int = TOKENS) -> list[SampleRequest]:
    return [
        SampleRequest(prompt=f"w1 w2 w3 req={i} mode={m}", prompt_len=0, expected_output_len=tokens)
        for i, m in enumerate(modes)
    ]


def _run(stub, requests, **settings):
    options = {"base_url": stub.url, "model": "stub-model", "disable_tqdm": True, "ready_check_timeout_s": 0}
    return asyncio.run(run_benchmark(BenchSettings(**(options | settings)), requests=requests))


def test_metrics_match_the_server_timings(stub):
    n = 10
    t0 = time.perf_counter()
    result = _run(stub, _requests(["ok"] * n), max_concurrency=2, metric_percentiles=[50.0, 99.0])
    wall = time.perf_counter() - t0
    served = [stub.by_tag(f"req={i}") for i in range(n)]

    # server-side figures, computed by hand from its timestamps
    ttft = np.array([s.send_times[0] - s.arrival for s in served]) * 1000
    e2el = np.array([s.send_times[-1] - s.arrival for s in served]) * 1000
    tpot = np.array([(s.send_times[-1] - s.send_times[0]) / (TOKENS - 1) for s in served]) * 1000
    gaps = np.concatenate([np.diff(s.send_times) for s in served]) * 1000

    assert result.completed == n and result.failed == 0
    client_ttft = np.array(result.ttfts) * 1000
    client_e2el = np.array(result.latencies) * 1000
    assert (client_ttft >= ttft).all() and np.median(client_ttft - ttft) < JITTER_MS
    assert (client_e2el >= e2el).all() and np.median(client_e2el - e2el) < DONE_DELAY_MS / 2
    assert result.stats["ttft"].median >= TTFT_MS
    assert result.stats["tpot"].median == pytest.approx(np.median(tpot), abs=MEDIAN_TOL_MS)
    assert result.stats["tpot"].median == pytest.approx(ITL_MS, abs=4.0)
    assert sum(len(gaps_i) for gaps_i in result.itls) == n * (TOKENS - 1)
    assert result.stats["itl"].mean == pytest.approx(gaps.mean(), abs=MEDIAN_TOL_MS)
    assert result.stats["e2el"].median == pytest.approx(np.median(client_e2el))

    # token counts from the server's usage; throughputs over the run's duration
    assert result.total_output_tokens == n * TOKENS and result.output_lens == [TOKENS] * n
    assert result.total_input_tokens == n * 5  # the stub counts words
    ends = np.array(result.start_times) + np.array(result.latencies)
    assert ends.max() <= result.duration < wall
    assert result.request_throughput == pytest.approx(n / result.duration)
    assert result.output_throughput == pytest.approx(n * TOKENS / result.duration)
    assert result.total_token_throughput == pytest.approx(n * (5 + TOKENS) / result.duration)
    assert [p for p, _ in result.stats["ttft"].percentiles] == [50.0, 99.0]


def test_chat_ttft_waits_for_the_first_token_not_the_role_chunk(stub):
    result = _run(stub, _requests(["ok"] * 4), endpoint="chat")
    assert result.completed == 4
    assert min(result.ttfts) * 1000 >= TTFT_MS  # the role chunk came at once
    assert [len(gaps) for gaps in result.itls] == [TOKENS - 1] * 4
    assert result.generated_texts == [TOKEN_TEXT * TOKENS] * 4
    body = stub.by_tag("req=0").body
    assert body["messages"] == [{"role": "user", "content": "w1 w2 w3 req=0 mode=ok"}]


def test_embeddings_requests_are_timed_whole(stub):
    modes = ["ok"] * 6 + ["http500"]
    result = _run(stub, _requests(modes), endpoint="/v1/embeddings", max_concurrency=3)
    assert result.completed == 6 and result.failed == 1 and result.errors[6].startswith("HTTP 500")
    served = [stub.by_tag(f"req={i}") for i in range(6)]
    client_e2el = np.array(result.latencies[:6]) * 1000
    server_e2el = np.array([s.send_times[0] - s.arrival for s in served]) * 1000
    assert (client_e2el >= server_e2el).all() and (server_e2el >= TTFT_MS).all()
    assert result.total_input_tokens == 6 * 5 and result.total_output_tokens == 0    # usage's prompt tokens
    assert result.percentile_metrics == ["e2el"] and result.run_info["backend"] == "openai-embeddings"
    assert served[0].body == {"model": "stub-model", "input": "w1 w2 w3 req=0 mode=ok", "encoding_format": "float"}
    report = format_result(result)
    assert "Request throughput" in report and "E2EL" in report
    assert "Output token" not in report and "TTFT" not in report


def test_failed_requests_count_as_failed_not_fast(stub):
    modes = ["ok"] * 4 + ["http500", "error_event", "drop", "no_done"]
    result = _run(stub, _requests(modes))
    assert result.completed == 4 and result.failed == 4
    errors = result.errors
    assert errors[:4] == [""] * 4
    assert errors[4].startswith("HTTP 500") and "error event" in errors[5]
    assert "RemoteProtocolError" in errors[6] and "[DONE]" in errors[7]
    # the failures (fast or short) are in no statistic and no token count
    assert result.stats["e2el"].percentiles[0][1] >= TTFT_MS + (TOKENS - 1) * ITL_MS
    assert result.stats["ttft"].mean >= TTFT_MS
    assert result.total_output_tokens == 4 * TOKENS
    assert result.output_lens[4:] == [0] * 4
    assert result.request_throughput == pytest.approx(4 / result.duration)


def test_goodput_counts_only_requests_meeting_every_slo(stub):
    modes = ["ok"] * 4 + ["slow"] * 3 + ["http500"]
    result = _run(stub, _requests(modes), goodput={"ttft": (TTFT_MS + SLOW_TTFT_MS) / 2})
    assert result.completed == 7
    assert result.request_goodput * result.duration == pytest.approx(4)
    both = _run(stub, _requests(modes), goodput={"ttft": 10_000, "tpot": 1})  # TPOT ~12 ms misses 1 ms
    assert both.request_goodput == 0


def test_max_concurrency_is_never_exceeded(stub):
    _run(stub, _requests(["ok"] * 12), max_concurrency=3)
    assert stub.max_in_flight == 3


def test_infinite_rate_without_a_cap_sends_all_at_once(stub):
    result = _run(stub, _requests(["ok"] * 8))
    assert stub.max_in_flight == 8
    assert result.max_concurrent_requests == 8


def test_request_rate_spaces_arrivals(stub):
    rate, n = 40.0, 30
    result = _run(stub, _requests(["ok"] * n, tokens=1), request_rate=rate)
    arrivals = sorted(stub.by_tag(f"req={i}").arrival for i in range(n))
    mean_gap = (arrivals[-1] - arrivals[0]) / (n - 1)
    assert 0.6 / rate < mean_gap < 1.5 / rate
    assert result.duration >= n / rate  # the last one leaves at n / rate


def test_warmup_requests_are_not_measured(stub):
    result = _run(stub, _requests(["ok"] * 3), num_warmups=2)
    assert result.completed == 3
    assert len(stub.requests) == 1 + 2 + 3  # first check, warm-ups, measured


def test_unreported_usage_is_counted_by_retokenizing(stub, shared_tokenizer):
    tokenizer = shared_tokenizer("qwen3")
    settings = BenchSettings(
        base_url=stub.url, model="stub-model", disable_tqdm=True, ready_check_timeout_s=0
    )
    result = asyncio.run(
        run_benchmark(settings, requests=_requests(["no_usage"] * 2, tokens=7), tokenizer=tokenizer)
    )
    expected = len(tokenizer(TOKEN_TEXT * 7, add_special_tokens=False).input_ids)
    assert result.generated_texts == [TOKEN_TEXT * 7] * 2
    assert result.output_lens == [expected] * 2
    assert result.input_lens == [0, 0]  # no usage: the dataset's prompt_len


def test_first_request_failure_stops_the_run_early(stub):
    with pytest.raises(BenchError, match="HTTP 500"):
        _run(stub, _requests(["http500", "ok"]))
    assert len(stub.requests) == 1


def test_waits_for_a_server_that_is_still_starting():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stub = StubOpenAIServer(ttft_ms=TTFT_MS, itl_ms=ITL_MS, port=port)
    starter = threading.Timer(1.0, stub.__enter__)
    starter.start()
    settings = BenchSettings(
        base_url=f"http://127.0.0.1:{port}", model="m", disable_tqdm=True, ready_check_timeout_s=20
    )
    try:
        result = asyncio.run(run_benchmark(settings, requests=_requests(["ok"] * 2)))
    finally:
        starter.join()
        stub.__exit__()
    assert result.completed == 2


def test_unreachable_server_is_a_clear_error():
    settings = BenchSettings(
        base_url="http://127.0.0.1:9", model="m", disable_tqdm=True, ready_check_timeout_s=0
    )
    with pytest.raises(BenchError, match="ConnectError"):
        asyncio.run(run_benchmark(settings, requests=_requests(["ok"])))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"endpoint": "rerank"}, "endpoint"),
        ({"dataset": "sharegpt"}, "dataset"),
        ({"dataset": "prefix"}, "prefix-len"),
        ({"request_rate": 0}, "request_rate"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"metric_percentiles": [0.0]}, "percentiles"),
        ({"percentile_metrics": ["ttft", "latency"]}, "latency"),
        ({"goodput": {"itl": 5.0}}, "itl"),
    ],
)
def test_bad_settings_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        BenchSettings(**options)


def test_cli_prints_vllm_report_and_writes_json(stub, tmp_path):
    tokenizer = shared_path("models", "tokenizers", "qwen3")
    out = tmp_path / "result.json"
    args = [
        "--base-url",
        stub.url,
        "--tokenizer",
        str(tokenizer),
        "--num-prompts",
        "6",
        "--random-input-len",
        "24",
        "--random-output-len",
        "3",
        "--percentiles",
        "50,90",
        "--goodput",
        "ttft:10000",
        "--max-concurrency",
        "4",
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "0",
        "--result-json",
        str(out),
    ]
    run = CliRunner().invoke(cli, args)
    assert run.exit_code == 0, run.output
    assert re.search(r"Successful requests:\s+6\b", run.output)
    assert re.search(r"Request goodput \(req/s\):\s+\d", run.output)
    for line in ("P90 TTFT (ms):", "Median TPOT (ms):", "P50 ITL (ms):", "Mean E2EL (ms):"):
        assert line in run.output
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and data["failed"] == 0 and data["model_id"] == "stub-model"
    assert data["total_output_tokens"] == 18 and len(data["itls"]) == 6 and "p90_ttft_ms" in data
    body = stub.requests[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 3 and body["ignore_eos"] is True and body["model"] == "stub-model"


def test_cli_finds_the_tokenizer_at_the_served_model_root():
    root = shared_path("models", "tokenizers", "qwen3")
    with StubOpenAIServer(ttft_ms=1, itl_ms=1, model_root=str(root)) as stub:
        run = CliRunner().invoke(
            cli,
            [
                "--base-url",
                stub.url,
                "--num-prompts",
                "2",
                "--random-input-len",
                "8",
                "--random-output-len",
                "2",
                "--disable-tqdm",
            ],
        )
    assert run.exit_code == 0, run.output
    assert re.search(r"Successful requests:\s+2\b", run.output)


def test_cli_without_a_tokenizer_says_how_to_give_one(stub):
    run = CliRunner().invoke(cli, ["--base-url", stub.url, "--num-prompts", "2", "--disable-tqdm"])
    assert run.exit_code == 1 and "pass --tokenizer PATH" in run.output


def test_cli_rejects_bad_options_by_name():
    run = CliRunner().invoke(cli, ["--goodput", "ttft=5"])
    assert run.exit_code == 2 and "NAME:MILLISECONDS" in run.output


def test_the_server_prefix_cache_counters_are_summed_over_engines_under_either_name():
    from tools.bench_serve import prefix_cache_counters

    pages = {
        "ringserve": ('ringserve:prefix_cache_hits_total{engine="0",model_name="m"} 30.0\n'
                      'ringserve:prefix_cache_hits_total{engine="1",model_name="m"} 10.0\n'
                      'ringserve:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n'
                      'ringserve:prefix_cache_queries_total{engine="1",model_name="m"} 60.0\n'
                      'ringserve:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9\n'),
        "vllm": 'vllm:prefix_cache_hits_total{engine="0"} 5.0\nvllm:prefix_cache_queries_total{engine="0"} 9.0\n',
        "none": "process_cpu_seconds_total 1.0\n",
    }

    async def read(kind: str):
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=pages[kind]))
        async with httpx.AsyncClient(transport=transport) as client:
            return await prefix_cache_counters(client, "http://server")

    assert asyncio.run(read("ringserve")) == (40.0, 160.0)
    assert asyncio.run(read("vllm")) == (5.0, 9.0)
    assert asyncio.run(read("none")) is None


def test_spec_decode_counters_become_vllms_acceptance_figures():
    from tools.bench_serve import spec_decode_counters, spec_decode_summary

    def page(scale: float) -> str:
        return "".join(f'ringserve:spec_decode_{name}_total{{engine="{e}",model_name="m"{pos}}} {v * scale}\n'
                       for e in ("0", "1") for name, pos, v in (
                           ("num_drafts", "", 10), ("num_draft_tokens", "", 40), ("num_accepted_tokens", "", 25),
                           ("num_accepted_tokens_per_pos", ',position="0"', 9),
                           ("num_accepted_tokens_per_pos", ',position="1"', 7)))

    async def read(text: str):
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
        async with httpx.AsyncClient(transport=transport) as client:
            return await spec_decode_counters(client, "http://server")

    before, after = asyncio.run(read(page(1))), asyncio.run(read(page(3)))
    summary = spec_decode_summary(before, after)      # the run: 40 drafts, 160 tokens, 100 accepted
    assert summary["drafts"] == 40 and summary["draft_tokens"] == 160 and summary["accepted_tokens"] == 100
    assert summary["acceptance_rate"] == 100 / 160 and summary["acceptance_length"] == 1 + 100 / 40
    assert summary["per_position_acceptance"] == [36 / 40, 28 / 40]
    assert spec_decode_summary(before, before) is None               # nothing drafted in the run
    assert asyncio.run(read("process_cpu_seconds_total 1.0\n")) is None


def test_structured_share_marks_requests_evenly():
    from tools.bench_serve import structured_mask

    assert structured_mask(10, 0.0) == [False] * 10
    assert structured_mask(10, 1.0) == [True] * 10
    assert sum(structured_mask(10, 0.2)) == 2 and sum(structured_mask(100, 0.8)) == 80
    assert structured_mask(5, 0.4) == [False, False, True, False, True]


def test_cli_runs_each_structured_share_and_prints_the_table(stub, tmp_path):
    out = tmp_path / "shares.json"
    args = ["--base-url", stub.url, "--tokenizer", str(shared_path("models", "tokenizers", "qwen3")),
            "--num-prompts", "5", "--random-input-len", "8", "--random-output-len", "2", "--disable-tqdm",
            "--ready-check-timeout-sec", "0", "--structured-output-ratio", "0,0.4,1",
            "--structured-output", '{"structured_outputs": {"regex": "[ab]+"}}', "--result-json", str(out)]
    run = CliRunner().invoke(cli, args)
    assert run.exit_code == 0, run.output
    assert "output throughput by share of constrained requests" in run.output
    table = run.output.split("output throughput by share")[1]
    assert re.search(r"\n\s+0% .*\+0\.0%", table) and re.search(r"\n\s+40% ", table) and re.search(r"\n\s+100% ", table)
    bodies = [r.body for r in stub.requests]
    constrained = [b for b in bodies if b.get("structured_outputs") == {"regex": "[ab]+"}]
    # a warm-up run of one constrained request (sent twice: its unmeasured first request, then measured),
    # then shares 0, 0.4 and 1 of 5 requests, each run with one unmeasured first request (request 0: never
    # marked at 0.4, marked at 1)
    assert len(constrained) == 2 + 0 + 2 + (5 + 1)
    assert len(json.loads(out.read_text())) == 3
