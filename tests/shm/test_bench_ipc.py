"""`ringserve bench ipc` runs end to end on a tiny scale and reports every transport it was asked for."""

from __future__ import annotations

import json

from click.testing import CliRunner

from frontend.cli import main


def test_bench_ipc_reports_latency_and_throughput_as_json():
    args = ["bench", "ipc", "--json", "--scale", "0.01", "--repeat", "2", "--size", "64", "--size", "4096",
            "--transport", "ring-spin", "--transport", "broadcast-2", "--transport", "mp-queue"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = {(r["transport"], r["size"]) for r in report["results"]}
    assert rows == {(t, s) for t in ("ring-spin", "broadcast-2", "mp-queue") for s in (64, 4096)}
    for row in report["results"]:
        assert 0 < row["rt_p50_us"] <= row["rt_p99_us"]
        assert row["msgs_per_s"] > 0 and row["rounds"] == 2
    assert set(report["ratios"]) == {"mp-queue/ring-spin rt_p50 @64", "mp-queue/ring-spin rt_p50 @4096"}
