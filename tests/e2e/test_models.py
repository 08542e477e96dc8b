"""Several models in one real server (`serve --models-dir DIR --models-max 1`), through the openai client and
httpx: the list with states and per-model settings, routing by `model` to GGUF files and directory models,
the 404 that lists the models, alternating requests under --models-max 1 (all answered by the right model),
the load and unload routes (no process outlives its engine), vLLM's sleep API (a request wakes a sleeping
model), and metrics labelled by model and engine."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

from tests.e2e.hostile import wait_for
from tests.e2e.models_dir import make_models_dir
from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = make_models_dir(tmp_path_factory.mktemp("models"))
    with ServerProcess("--models-dir", str(directory), "--models-max", "1", "--models-wait", "120",
                       startup_timeout=300) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=120, max_retries=0)


def states(server) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(server.base_url + "/models").json()["data"]}



def test_every_model_is_listed_with_its_state_and_settings(server, client):
    assert server.model == ",".join(sorted(states(server)))     # the ready line names them all
    listed = {m.id: m for m in client.models.list().data}
    assert {"demo-a", "demo-b"} <= set(listed)
    for model in listed.values():
        assert model.status["value"] in ("unloaded", "loading", "loaded", "sleeping", "unloading")
    if "smol" in listed:
        assert listed["smol"].max_model_len == 2048                  # NAME.toml beside NAME.gguf
        assert listed["smol-b"].max_model_len == 2048                # its table in DIR/models.toml
    if "qwen3-tiny" in listed:
        assert listed["qwen3-tiny"].max_model_len == 1024            # ringserve.toml inside the directory


def test_an_unknown_model_is_a_404_naming_it_and_the_models(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    message = refused.value.body["message"]
    assert "`no-such-model` does not exist" in message and "`demo-a`" in message and "`demo-b`" in message


def test_gguf_and_directory_models_answer_by_name(server, client):
    names = set(states(server))
    for name in [n for n in ("smol", "demo-a", "qwen3-tiny") if n in names]:
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert reply.model == name and reply.usage.completion_tokens >= 1
        assert states(server)[name] == "loaded"
        assert [n for n, state in states(server).items() if state == "loaded"] == [name]    # --models-max 1


def test_settings_file_sets_sampling_defaults(server, client):
    if "qwen3-tiny" not in states(server):
        pytest.skip("../shared's qwen3-tiny config and Qwen3 tokenizer are not present")
    # temperature 0 from the model's ringserve.toml (its generation_config.json says otherwise): greedy
    texts = {client.completions.create(model="qwen3-tiny", prompt="Once upon", max_tokens=12).choices[0].text
             for _ in range(2)}
    assert len(texts) == 1


def test_alternating_requests_two_at_a_time_under_models_max_1_all_succeed(server, client):
    def ask(i: int) -> str:
        name = ("demo-a", "demo-b")[i % 2]
        reply = client.completions.create(model=name, prompt=f"request {i}", max_tokens=3)
        return reply.model

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answered = list(pool.map(ask, range(6)))
    assert answered == ["demo-a", "demo-b"] * 3


def test_load_and_unload_routes_leave_no_process_behind(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for name, state in states(server).items():       # every model stopped, parked ones included
            if state != "unloaded":
                assert http.post("/models/unload", json={"model": name}).status_code == 200
        assert wait_for(lambda: not server.descendants()), server.descendants()
        loaded = http.post("/models/load", json={"model": "demo-b"})
        assert loaded.status_code == 200 and loaded.json()["status"]["value"] == "loaded"
        assert states(server)["demo-b"] == "loaded" and server.descendants()
        unloaded = http.post("/models/unload", json={"model": "demo-b"})
        assert unloaded.status_code == 200 and unloaded.json()["status"]["value"] == "unloaded"
        assert wait_for(lambda: not server.descendants()), server.descendants()
        missing = http.post("/models/load", json={"model": "nope"})
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
        bad = http.post("/models/load", json={"name": "demo-b"})
        assert bad.status_code == 400


def test_sleep_api_and_a_request_wakes_a_sleeping_model(server, client):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        assert http.post("/models/load", json={"model": "demo-a"}).status_code == 200
        for level in ("1", "2"):
            assert http.post("/sleep", params={"level": level, "model": "demo-a"}).status_code == 200
            assert http.get("/is_sleeping", params={"model": "demo-a"}).json()["is_sleeping"] is True
            assert states(server)["demo-a"] == "sleeping"
            reply = client.completions.create(model="demo-a", prompt="wake", max_tokens=3)
            assert reply.usage.completion_tokens == 3
            assert http.get("/is_sleeping", params={"model": "demo-a"}).json()["is_sleeping"] is False
        assert http.post("/sleep", params={"level": "3", "model": "demo-a"}).status_code == 400


def test_metrics_carry_model_and_engine_labels(server, client):
    client.completions.create(model="demo-a", prompt="count me", max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    assert 'ringserve:request_success_total{engine="0",finished_reason="length",model_name="demo-a"}' in text
    assert 'ringserve:model_state{model_name="demo-a",state="loaded"} 1.0' in text
    assert 'ringserve:model_loads_total{model_name="demo-b"}' in text
    assert 'ringserve:prompt_tokens_total{engine="0",model_name="demo-a"}' in text


@pytest.mark.slow
def test_twenty_alternating_gguf_requests_two_at_a_time_all_succeed(server, client):
    if "smol-b" not in states(server):
        pytest.skip("the bundled SmolLM2 is not installed")

    def ask(i: int) -> str:
        name = ("smol", "smol-b")[i % 2]
        return client.chat.completions.create(model=name, messages=[{"role": "user", "content": f"hi {i}"}],
                                              max_tokens=4).model

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answered = list(pool.map(ask, range(20)))
    assert answered == ["smol", "smol-b"] * 10


def test_bench_swap_reports_cold_swap_and_wake_times(server):
    from click.testing import CliRunner

    from tools.bench_swap import cli

    result = CliRunner().invoke(cli, ["--base-url", server.url, "--models", "demo-a,demo-b", "--rounds", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for row in ("cold", "warm", "swap", "wake_up (level 1)", "after sleep level 2"):
        assert report[row]["n"] >= 1 and report[row]["median_s"] > 0, row
    assert report["swap"]["n"] == 2 and "swap_adds_s" in report


def test_ollama_routes_route_by_model_and_keep_alive_unloads(server):
    import ollama

    client = ollama.Client(host=server.url, timeout=120)
    assert {"demo-a", "demo-b"} <= {m.model for m in client.list().models}       # /api/tags: every model
    reply = client.chat("demo-b:latest", [{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert reply.model == "demo-b:latest" and reply.done
    running = {m.model: m for m in client.ps().models}
    assert "demo-b" in running and running["demo-b"].expires_at.year == 9999     # no --idle-unload here
    unloading = client.generate("demo-b", "", keep_alive=0)                        # keep_alive 0: unload
    assert unloading.done_reason == "unload"
    assert wait_for(lambda: states(server)["demo-b"] == "unloaded", 30), states(server)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat("no-such-model", [{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404
