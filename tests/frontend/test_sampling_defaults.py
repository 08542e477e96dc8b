"""The server samples a request with the engine's sampling defaults (--generation-config and
--override-generation-config, as vLLM) where the request leaves a field unset, and with the request's own
value where it sets one; the CLI takes both flags for `serve` and `generate`."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from click.testing import CliRunner

import frontend.server
from frontend.cli import main
from tests.frontend.harness import serve_fake


@pytest.fixture(scope="module")
def served_with_defaults(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("generation-config")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_p": 0.9}))
    server, fake = serve_fake(tiny_model, engine_overrides={
        "generation_config": str(folder), "override_generation_config": {"top_k": 7, "max_new_tokens": 5}})
    with server:
        yield server, fake


def sampled(served, path: str, body: dict):
    server, fake = served
    response = httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=10)
    assert response.status_code == 200, response.text
    return fake.submitted[-1][2]


def test_unset_fields_take_the_defaults(served_with_defaults):
    params = sampled(served_with_defaults, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.3, 0.9, 7, 5)
    assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)           # neutral: no default given
    params = sampled(served_with_defaults, "/v1/completions", {"prompt": "hi"})
    assert (params.temperature, params.max_tokens) == (0.3, 5)


def test_the_requests_own_values_win(served_with_defaults):
    params = sampled(served_with_defaults, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "temperature": 1.2, "top_k": 2, "max_tokens": 9})
    assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (1.2, 2, 0.9, 9)


def test_serve_and_generate_take_the_flags(monkeypatch, tiny_model, caplog):
    caplog.set_level(logging.INFO, logger="ringserve")
    configs = []
    monkeypatch.setattr(frontend.server, "launch_server", configs.append)
    result = CliRunner().invoke(main, ["serve", str(tiny_model), "--device", "cpu", "--generation-config", "vllm",
                                       "--override-generation-config", '{"temperature": 0.5}'])
    assert result.exit_code == 0, result.output
    assert configs[0].engine.sampling_defaults.values == {"temperature": 0.5}
    assert "sampling defaults: temperature 0.5 (--generation-config vllm" in caplog.text
    for bad, message in (('{"temprature": 1}', "unknown field"), ("[1]", "must be a JSON object"),
                         ("{oops", "not JSON")):
        serve = ["serve", str(tiny_model)]
        generate = ["generate", str(tiny_model), "a prompt"]
        for command in (serve, generate):
            result = CliRunner().invoke(main, [*command, "--device", "cpu", "--override-generation-config", bad])
            assert result.exit_code == 2 and message in result.output, (command, bad, result.output)
