"""tools/probe_long_prompt against a fake-engine server: the prompt's answer, and /health probed meanwhile."""

from __future__ import annotations

from tests.frontend.harness import serve_fake, write_tiny_model
from tools.probe_long_prompt import probe


def test_probe_reports_the_answer_and_the_health_probes(tmp_path):
    server, _ = serve_fake(write_tiny_model(tmp_path / "tiny"))
    with server:
        result = probe(server.url, 200_000, "chat", None)
    assert result["status"] == 400 and "characters" in result["answer"]        # certain to exceed: refused
    assert result["health_probes"] >= 1 and result["longest_health_seconds"] >= 0
