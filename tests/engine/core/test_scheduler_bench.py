"""The scheduler benchmark stays runnable: `ringserve bench scheduler` prints one row per batch size."""

from __future__ import annotations

from click.testing import CliRunner

from frontend.cli import main


def test_bench_scheduler_prints_a_row_per_batch_size():
    result = CliRunner().invoke(main, ["bench", "scheduler", "--batch-sizes", "4,16", "--steps", "20"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [row[0] for row in rows] == ["4", "16"]
    assert all(float(row[1]) > 0 for row in rows)
