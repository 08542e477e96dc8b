"""Ollama's /api/embed and /api/embeddings over the fake pooling engine, through the official `ollama` client:
the shapes, vectors equal to /v1/embeddings's for the same inputs, truncate (true cuts to max_model_len, false
is a 400 naming it), dimensions, the empty load request, and the refusals in Ollama's {"error"} shape (a
generative model, another model's name). Fuzzing and auth: tests/frontend/openai/test_embeddings.py. Real
vectors: tests/e2e/test_embeddings.py."""

from __future__ import annotations

import httpx
import numpy as np
import ollama
import pytest

from tests.frontend.harness import TINY_MAX_MODEL_LEN
from tests.frontend.openai.test_embeddings import pooled, pooling_model, vectors  # noqa: F401 (fixtures)

TEXTS = ["hello", "a longer text", "ünï 🙂"]


@pytest.fixture(scope="module")
def embedder(pooled):  # noqa: F811
    return ollama.Client(host=pooled[0].url, timeout=10)


def openai_vectors(server, texts) -> np.ndarray:
    return vectors(httpx.post(server.url + "/v1/embeddings", json={"input": texts}, timeout=10))


def test_embed_gives_the_vectors_of_v1_embeddings(pooled, embedder):  # noqa: F811
    server, fake = pooled
    answer = embedder.embed(model="tiny", input=TEXTS)
    ours = np.array(answer.embeddings, dtype=np.float32)
    assert answer.model == "tiny" and ours.shape == (3, 64)
    np.testing.assert_array_equal(ours, openai_vectors(server, TEXTS))
    assert answer.prompt_eval_count == sum(len(t.encode()) for t in TEXTS)      # one token per byte
    assert answer.total_duration > 0 and answer.load_duration == 0
    one = embedder.embed(model="tiny:latest", input="hello")
    np.testing.assert_array_equal(np.array(one.embeddings, dtype=np.float32), openai_vectors(server, ["hello"]))
    legacy = embedder.embeddings(model="tiny", prompt="hello")
    np.testing.assert_array_equal(np.array([legacy.embedding], dtype=np.float32), openai_vectors(server, ["hello"]))


def test_truncate_cuts_to_max_model_len_and_false_refuses(pooled, embedder):  # noqa: F811
    server, fake = pooled
    long_text = "x" * (TINY_MAX_MODEL_LEN + 10)
    cut = embedder.embed(model="tiny", input=["ok", long_text])                 # Ollama's default: truncate
    assert cut.prompt_eval_count == 2 + TINY_MAX_MODEL_LEN
    np.testing.assert_array_equal(np.array(cut.embeddings[1], dtype=np.float32),
                                  openai_vectors(server, ["x" * TINY_MAX_MODEL_LEN])[0])
    submitted = server.call(lambda: len(fake.encoded))
    with pytest.raises(ollama.ResponseError) as refused:
        embedder.embed(model="tiny", input=["ok", long_text], truncate=False)
    assert refused.value.status_code == 400
    assert f"max_model_len ({TINY_MAX_MODEL_LEN})" in refused.value.error and '"truncate": true' in refused.value.error
    assert refused.value.error.startswith("input[1]: ")
    with pytest.raises(ollama.ResponseError, match=r"max_model_len .*use /api/embed") as legacy:
        embedder.embeddings(model="tiny", prompt=long_text)                     # no truncate there: nothing cut
    assert legacy.value.status_code == 400
    assert server.call(lambda: len(fake.encoded)) == submitted                  # nothing reached the engine


def test_dimensions_empty_inputs_and_bad_requests(pooled, embedder):  # noqa: F811
    server, fake = pooled
    full = openai_vectors(server, ["hello"])[0]
    small = np.array(embedder.embed(model="tiny", input="hello", dimensions=16).embeddings[0], dtype=np.float32)
    np.testing.assert_allclose(small, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    for bad, match in (({"dimensions": 20}, "dimensions"), ({"input": ["a", ""]}, "input"),
                       ({"keep_alive": "soon"}, "keep_alive"), ({"options": {"num_ctx": 0}}, "options.num_ctx")):
        response = httpx.post(server.url + "/api/embed", json={"model": "tiny", "input": "a", **bad}, timeout=10)
        assert response.status_code == 400 and match in response.json()["error"], response.text
    submitted = server.call(lambda: len(fake.encoded))
    assert embedder.embed(model="tiny", input=[]).embeddings == []              # Ollama's load request
    assert embedder.embeddings(model="tiny", prompt="").embedding == []
    assert server.call(lambda: len(fake.encoded)) == submitted
    with pytest.raises(ollama.ResponseError, match="not found") as missing:
        embedder.embed(model="other", input="x")
    assert missing.value.status_code == 404


@pytest.mark.parametrize("route", ["embed", "embeddings"])
def test_a_generative_model_is_a_400_naming_its_kind(served, route):
    server, fake = served                   # the shared generative fake (tests/frontend/conftest.py)
    client = ollama.Client(host=server.url, timeout=10)
    with pytest.raises(ollama.ResponseError, match="tiny is a generative model") as refused:
        if route == "embed":
            client.embed(model="tiny", input=["x"])
        else:
            client.embeddings(model="tiny", prompt="x")
    assert refused.value.status_code == 400 and "--runner pooling" in refused.value.error
    response = httpx.post(f"{server.url}/api/{route}", json={"model": "tiny", "input": "x", "prompt": "x"})
    assert set(response.json()) == {"error"}                                    # Ollama's shape
