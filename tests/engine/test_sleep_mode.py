"""vLLM's sleep mode on the real processes (through the offline LLM and its EngineClient): level 1 frees the
KV cache, level 2 the weights too; waking (or a request, which wakes the engine itself) restores them, and
greedy output is the same token for token before and after; a busy engine refuses to sleep; the startup
handshake reports loading progress."""

from __future__ import annotations

import pytest

from engine.client.engine_client import EngineClient
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [3, 14, 15, 92, 65]


def generate(client: EngineClient, request_id: str) -> list[int]:
    client.add_request(request_id, PROMPT, GREEDY)
    tokens: list[int] = []
    while True:
        for delta in client.poll(timeout=5.0):
            tokens += delta.new_token_ids
            if delta.finished:
                return tokens


@pytest.fixture(scope="module")
def llm(tiny_model):
    path = tiny_model("Qwen3ForCausalLM", max_position_embeddings=256)
    with LLM(str(path), device="cpu", kv_cache_memory=1 << 20) as llm:
        yield llm


@pytest.fixture
def client(llm) -> EngineClient:
    return llm.engine


def test_startup_reported_its_progress_and_ended_ready(client):
    assert client.loading.stage == "ready"


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_then_wake_gives_the_same_tokens(llm, client, level):
    before = generate(client, f"before-{level}")
    assert llm.sleep(level).startswith(f"asleep at level {level}")
    assert llm.wake_up() == "awake"
    assert generate(client, f"after-{level}") == before


def test_a_request_wakes_a_sleeping_engine(client):
    before = generate(client, "awake")
    client.call_sync("sleep", level=2)
    assert generate(client, "woken") == before        # no wake_up: the request does it


def test_sleep_refuses_bad_levels_and_a_busy_engine(client):
    with pytest.raises(ValueError, match="sleep level must be 1 or 2"):
        client.call_sync("sleep", level=3)
    client.add_request("busy", PROMPT, SamplingParams(max_tokens=200, ignore_eos=True))
    with pytest.raises(ValueError, match="unfinished requests; it sleeps only when idle"):
        client.call_sync("sleep", level=1)
    client.abort_request("busy")
