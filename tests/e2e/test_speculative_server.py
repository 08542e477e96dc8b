"""`ringserve serve --speculative-config ...` end to end: two data-parallel engines on the fake model (whose
next token is a function of the last one, so its outputs cycle and prompt lookup's drafts are accepted),
vLLM's spec_decode counters per engine in /metrics, `bench serve` reporting the acceptance, and a bad config
refused by name."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import ServerProcess

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def server():
    with ServerProcess("ringserve-demo", "-dp", "2", "--load-format", "fake",
                       "--speculative-config", json.dumps(SPEC)) as s:
        yield s


def spec_counters(server: ServerProcess) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name.startswith("ringserve:spec_decode") and sample.name.endswith("_total"):
                out[(sample.name, sample.labels["engine"], sample.labels.get("position", ""))] = sample.value
    return out


def test_drafts_are_verified_and_counted_per_engine(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="x")
    for prompt in ("abcabcabcabc", "xyzxyzxyz", "hello hello hello", "0123401234"):
        completion = client.completions.create(model=server.model, prompt=prompt, max_tokens=40,
                                               extra_body={"ignore_eos": True})
        assert completion.usage.completion_tokens == 40
    counters = spec_counters(server)
    engines = {engine for (_, engine, _) in counters}
    assert engines == {"0", "1"}
    total = {name: sum(v for (n, _, _), v in counters.items() if n == name) for name, _, _ in counters}
    drafts = total["ringserve:spec_decode_num_drafts_total"]
    accepted = total["ringserve:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and 0 < accepted <= total["ringserve:spec_decode_num_draft_tokens_total"]
    per_position = [v for (n, _, p), v in counters.items() if n.endswith("_per_pos_total") and p == "0"]
    assert sum(per_position) <= drafts and sum(v for (n, _, _), v in counters.items()
                                               if n.endswith("_per_pos_total")) == accepted


def test_bench_serve_reports_acceptance(server):
    from tools.bench_metrics import format_result
    from tools.bench_serve import BenchSettings, run_benchmark

    settings = BenchSettings(base_url=server.url, dataset="code", num_prompts=4, random_output_len=24,
                             disable_tqdm=True, ready_check_timeout_s=30)
    result = asyncio.run(run_benchmark(settings))
    assert result.completed == 4
    spec = result.spec_decode
    assert spec is not None and spec["drafts"] > 0 and 0 < spec["acceptance_rate"] <= 1
    assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"])
    assert "Acceptance rate (%):" in format_result(result)


def test_a_bad_speculative_config_is_refused_by_name():
    from frontend.cli.serve import serve

    run = CliRunner().invoke(serve, ["ringserve-demo", "--speculative-config",
                                     '{"method": "ngram", "num_speculative_tokens": -1}'])
    assert run.exit_code == 2 and "num_speculative_tokens" in run.output
    run = CliRunner().invoke(serve, ["ringserve-demo", "--speculative-config", '{"method": "eagle3"}'])
    assert run.exit_code == 2 and "method" in run.output
