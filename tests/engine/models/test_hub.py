"""Hub repo ids as MODEL, against a loopback server that speaks the hub's file API (HF_ENDPOINT points at
it) and serves a tiny model the test builds: download, cache reuse, revisions, offline mode with and without
a cache, and each failure as one clear ConfigError (401/403 gated, 404, no network, no safetensors,
unsupported architecture)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.config import ConfigError, EngineConfig
from engine.models.demo import ensure_demo_model
from engine.models.hub import looks_like_repo_id
from tests.engine.hf_models import make_tiny_model
from tests.engine.models.loopback_hub import LoopbackHub, Repo, directory_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny Qwen3 model directory's files with the demo model's byte tokenizer."""
    path = make_tiny_model("Qwen3ForCausalLM", tmp_path_factory.mktemp("hub-model") / "m", vocab_size=259)
    demo = Path(ensure_demo_model(str(tmp_path_factory.mktemp("demo"))))
    files = directory_files(path)
    files.update({name: (demo / name).read_bytes() for name in TOKENIZER_FILES})
    files["README.md"] = b"not downloaded: only what the engine reads is"
    return files


@pytest.fixture
def hub(monkeypatch, tiny_files):
    with LoopbackHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        repo = hub.repos["acme/tiny"] = Repo()
        repo.add_commit(tiny_files, "main")
        yield hub


def _resolve(model: str, cache, **kwargs) -> EngineConfig:
    return EngineConfig(model=model, download_dir=str(cache), device="cpu", **kwargs).finalize()


def test_repo_id_downloads_only_what_the_engine_reads_and_runs(hub, tmp_path, tiny_files):
    config = _resolve("acme/tiny", tmp_path)
    assert config.model.startswith(str(tmp_path)) and config.model_name == "acme/tiny"
    downloaded = {p.rsplit("/", 1)[1] for p in hub.downloads()}
    assert downloaded == set(tiny_files) - {"README.md"}
    with LLM.from_config(config) as llm:
        out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_structured_outputs_compile_against_the_hub_snapshot_tokenizer(hub, tmp_path):
    from engine import StructuredOutputsParams

    so = StructuredOutputsParams(regex="[0-9]{3}")
    with LLM.from_config(_resolve("acme/tiny", tmp_path, in_process=True)) as llm:
        out = llm.generate(["n"], SamplingParams(temperature=0, max_tokens=8, structured_outputs=so),
                           use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.text) == 3 and out.text.isdigit()


def test_second_resolution_reuses_the_cache(hub, tmp_path):
    first = _resolve("acme/tiny", tmp_path).model
    count = len(hub.downloads())
    assert _resolve("acme/tiny", tmp_path).model == first
    assert len(hub.downloads()) == count                   # metadata asked again, no file fetched twice


def test_revision_selects_a_commit(hub, tmp_path, tiny_files):
    config = json.loads(tiny_files["config.json"])
    changed = dict(tiny_files, **{"config.json": json.dumps({**config, "max_position_embeddings": 64}).encode()})
    commit = hub.repos["acme/tiny"].add_commit(changed, "v2")
    resolved = _resolve("acme/tiny", tmp_path, revision="v2")
    assert resolved.model.endswith(commit) and resolved.max_model_len == 64
    assert _resolve("acme/tiny", tmp_path / "other").max_model_len == config["max_position_embeddings"]
    with pytest.raises(ConfigError, match="has no revision 'v9'"):
        _resolve("acme/tiny", tmp_path, revision="v9")


def test_offline_mode_uses_the_cache_and_says_when_it_is_empty(hub, tmp_path, monkeypatch):
    online = _resolve("acme/tiny", tmp_path).model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.requests)
    assert _resolve("acme/tiny", tmp_path).model == online
    assert len(hub.requests) == before                      # offline: not one request
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set and acme/tiny is not in the hub cache"):
        _resolve("acme/tiny", tmp_path / "empty")


def test_gated_repo_needs_a_granted_token(hub, tmp_path, monkeypatch, tiny_files):
    gated = hub.repos["acme/gated"] = Repo(gated_token="hf_granted")
    gated.add_commit(tiny_files, "main")
    with pytest.raises(ConfigError, match=r"acme/gated is a gated repo and no token was sent \(401\)"):
        _resolve("acme/gated", tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    with pytest.raises(ConfigError, match=r"gated repo and the token \(HF_TOKEN\) has not been granted.*\(403\)"):
        _resolve("acme/gated", tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    assert _resolve("acme/gated", tmp_path).model_name == "acme/gated"


def test_missing_repo_is_a_404_error(hub, tmp_path):
    with pytest.raises(ConfigError, match=r"'acme/nothing' is neither a local path nor a repo on .*404"):
        _resolve("acme/nothing", tmp_path)


def test_no_network_is_named(monkeypatch, tmp_path):
    with socket.socket() as s:                                # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ConfigError, match="cannot reach the Hugging Face hub at http://127.0.0.1"):
        _resolve("acme/tiny", tmp_path)


def test_repo_without_safetensors_or_with_another_architecture(hub, tmp_path, tiny_files):
    hub.repos["acme/bin"] = Repo()
    hub.repos["acme/bin"].add_commit({"config.json": tiny_files["config.json"], "pytorch_model.bin": b"x"}, "main")
    with pytest.raises(ConfigError, match="acme/bin has no safetensors weights"):
        _resolve("acme/bin", tmp_path)
    gpt2 = dict(tiny_files, **{"config.json": json.dumps({"architectures": ["GPT2LMHeadModel"]}).encode()})
    hub.repos["acme/gpt2"] = Repo()
    hub.repos["acme/gpt2"].add_commit(gpt2, "main")
    with pytest.raises(ConfigError, match="unsupported architecture \\['GPT2LMHeadModel'\\]"):
        _resolve("acme/gpt2", tmp_path)


def test_what_counts_as_a_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert looks_like_repo_id("Qwen/Qwen3-0.6B") and looks_like_repo_id("meta-llama/Llama-3.2-1B")
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert not looks_like_repo_id("local/model")            # an existing path wins
    for path in ("./a/b", "/a/b", "a/b/c", "a", "org/model.gguf"):
        assert not looks_like_repo_id(path), path
