"""tools/compare_embed_serving's report: medians and ranges per engine, the ratios, and the target line."""

from __future__ import annotations

from tools.compare_embed_serving import FIGURES, _summary, _variant, format_report


def _engine(rates: list[float], cosine: float = 1.0) -> dict:
    return {"request_throughput": _summary(rates), "median_e2el_ms": _summary([300.0] * len(rates)),
            "p99_e2el_ms": _summary([900.0] * len(rates)), "min_cosine": cosine}


def test_the_report_compares_the_medians_with_the_target():
    report = {"model": "m", "threads": 2, "concurrency": 16, "num_prompts": 100, "input_tokens": 1700, "rounds": 3,
              "machine": "cpu", "ours": "ringserve float32", "peer": "llama.cpp m-f32.gguf",
              "engines": {"ringserve float32": _engine([40.0, 50.0, 45.0]),
                          "llama.cpp m-f32.gguf": _engine([30.0, 60.0, 50.0], 0.99999),
                          "llama.cpp m-f16.gguf": _engine([90.0, 80.0, 100.0])},
              "load": {"ringserve float32": [(1.0, 2.0)]}}
    text = format_report(report)
    assert "45.0 [40.0-50.0]" in text and "0.99999" in text
    assert "ringserve float32 / llama.cpp m-f32.gguf: 0.90x" in text
    assert "ringserve float32 / llama.cpp m-f16.gguf: 0.50x" in text
    assert "target: ringserve float32 >= 1x llama.cpp m-f32.gguf: MISSED (0.90x)" in text
    assert set(FIGURES) <= set(report["engines"]["ringserve float32"])


def test_a_peer_variant_splits_into_flags_and_environment():
    assert _variant("--poll 0 OMP_WAIT_POLICY=PASSIVE") == (["--poll", "0"], {"OMP_WAIT_POLICY": "PASSIVE"})
    assert _variant("--pooling=cls") == (["--pooling=cls"], {}) and _variant("") == ([], {})
