"""The scale-out benchmarks' own logic: the routing microbenchmark runs every policy, and the best possible
hit rate of a shared-prefix workload is what one perfect cache would find."""

from __future__ import annotations

from click.testing import CliRunner

from tools.bench_datasets import SampleRequest
from tools.bench_dp_routing import best_hit_rate
from tools.bench_router import cli as bench_router


class ByteTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())


def test_the_router_microbenchmark_reports_each_policy():
    result = CliRunner().invoke(bench_router, ["--num-prefixes", "2", "--per-prefix", "2", "--prompt-len", "64",
                                               "--prefix-len", "48", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    for policy in ("prefix", "load", "round_robin"):
        assert f"  {policy} " in result.output and "us CPU" in result.output


def test_best_hit_rate_counts_reusable_full_blocks_after_the_first_of_each_prefix():
    a, b = "a" * 40, "b" * 40                    # 2 full blocks of 16 shared per prefix, 8 bytes of tail
    requests = [SampleRequest(p + t, 0, 1) for p, t in ((a, "1"), (b, "1"), (a, "2"), (b, "2"), (a, "3"))]
    # sent: requests[0] once unmeasured, then all five; 'a1' again hits 2 blocks (its own earlier copy)
    hits = 32 + 0 + 32 + 32 + 32
    assert best_hit_rate(ByteTokenizer(), requests, 16) == hits / (5 * 41)
