"""The pooling routes (/v1/embeddings, /v1/score, /score, /v1/rerank, /rerank) over a fake pooling engine: the
request shapes, the official client's base64 default, truncation and the max_model_len refusal, `dimensions`
on a Matryoshka model, pairing and ranking, the errors that keep generation and pooling apart (both ways),
auth, a client that leaves (its engine requests aborted), a dead engine (503), and schemathesis fuzzing of
the routes against /openapi.json. Real vectors against sentence-transformers: tests/e2e/test_embeddings.py."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance

from engine.client.scoring import cosine
from frontend.config import ServerConfig
from tests.frontend.harness import TINY_MAX_MODEL_LEN, serve_fake, write_tiny_model
from tests.frontend.openai.test_validation import assert_error
from tests.frontend.test_streaming_faults import wait_for

POOLING_ROUTES = ("/v1/embeddings", "/v1/score", "/score", "/v1/rerank", "/rerank", "/api/embed", "/api/embeddings")
MATRYOSHKA = [16, 32]
DOCUMENTS = ["abc", "xyz", "aab", "zzz"]


@pytest.fixture(scope="module")
def pooling_model(tmp_path_factory):
    """The tiny byte-level model as an embedding model (64 dimensions; Matryoshka sizes 16 and 32)."""
    path = write_tiny_model(tmp_path_factory.mktemp("tiny-pooling"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": MATRYOSHKA}))
    return path


def serve_pooling(model, **options):
    return serve_fake(model, engine_overrides={"runner": "pooling", "load_format": "dummy"}, **options)


@pytest.fixture(scope="module")
def pooled(pooling_model):
    server, fake = serve_pooling(pooling_model)
    with server:
        yield server, fake


@pytest.fixture
def http(pooled):
    with httpx.Client(base_url=pooled[0].url, timeout=10) as client:
        yield client


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_the_official_client_gets_base64_equal_to_float(pooled):
    server, fake = pooled
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    by_default = client.embeddings.create(model="tiny", input=["hello", "a longer text", "ünï 🙂"], user="u1")
    as_float = client.embeddings.create(model="tiny", input=["hello", "a longer text", "ünï 🙂"],
                                        encoding_format="float")
    assert [d.index for d in by_default.data] == [0, 1, 2] and by_default.model == "tiny"
    ours = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_array_equal(np.array([d.embedding for d in by_default.data], dtype=np.float32), ours)
    assert ours.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)      # the model's normalize
    tokens = len("hello") + len("a longer text") + len("ünï 🙂".encode())          # one token per byte
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == tokens


def test_token_ids_give_the_vectors_of_their_text(http):
    by_text = vectors(http.post("/v1/embeddings", json={"input": ["hi", "abc"]}))
    by_ids = vectors(http.post("/v1/embeddings", json={"input": [list(b"hi"), list(b"abc")]}))
    np.testing.assert_array_equal(by_ids, by_text)
    np.testing.assert_array_equal(vectors(http.post("/v1/embeddings", json={"input": list(b"hi")})), by_text[:1])


def test_inputs_over_max_model_len_are_refused_unless_truncated(pooled, http):
    server, fake = pooled
    long_text = "x" * (TINY_MAX_MODEL_LEN + 10)
    error = assert_error(http.post("/v1/embeddings", json={"input": ["ok", long_text]}), 400, "input")
    assert f"input[1]: the input has {TINY_MAX_MODEL_LEN + 10} tokens" in error["message"]
    assert f"max_model_len ({TINY_MAX_MODEL_LEN})" in error["message"]
    assert_error(http.post("/v1/embeddings", json={"input": [0] * (TINY_MAX_MODEL_LEN + 1)}), 400, "input")
    submitted = server.call(lambda: len(fake.encoded))
    for body in ({"input": ["abcdefghij", "xyz"]}, {"input": [list(range(1, 21))]}):
        cut = http.post("/v1/embeddings", json={**body, "truncate_prompt_tokens": 8})
        assert cut.status_code == 200, cut.text
    got = server.call(lambda: [prompt for _, prompt, _ in fake.encoded[submitted:]])
    assert sorted(got) == sorted([list(b"abcdefgh"), list(b"xyz"), list(range(1, 9))])   # the tokenizer's side
    whole = http.post("/v1/embeddings", json={"input": long_text, "truncate_prompt_tokens": -1})
    assert whole.json()["usage"]["prompt_tokens"] == TINY_MAX_MODEL_LEN
    huge = "x" * 100 * TINY_MAX_MODEL_LEN              # certain to exceed: refused before it is tokenized
    error = assert_error(http.post("/v1/embeddings", json={"input": huge}), 400, "input")
    assert "characters" in error["message"] and "max_model_len" in error["message"]
    cut = http.post("/v1/embeddings", json={"input": huge, "truncate_prompt_tokens": 4})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == 4
    assert_error(http.post("/v1/embeddings", json={"input": "x", "truncate_prompt_tokens": TINY_MAX_MODEL_LEN + 1}),
                 400, "truncate_prompt_tokens")
    assert_error(http.post("/v1/embeddings", json={"input": "x", "truncate_prompt_tokens": 0}),
                 400, "truncate_prompt_tokens")


def test_dimensions_only_where_the_model_has_them(http):
    full = vectors(http.post("/v1/embeddings", json={"input": "hello"}))
    small = vectors(http.post("/v1/embeddings", json={"input": "hello", "dimensions": 16}))
    assert small.shape == (1, 16)
    np.testing.assert_allclose(small[0], full[0, :16] / np.linalg.norm(full[0, :16]), atol=1e-6)
    error = assert_error(http.post("/v1/embeddings", json={"input": "hello", "dimensions": 20}), 400, "dimensions")
    assert "16, 32" in error["message"]
    assert_error(http.post("/v1/embeddings", json={"input": "hello", "dimensions": 0}), 400, "dimensions")


@pytest.mark.parametrize("body", [{"input": ""}, {"input": []}, {"input": ["a", ""]}, {"input": [[]]},
                                  {"input": ["a", 1]}, {"input": "a", "encoding_format": "hex"},
                                  {"input": [300]}, {"input": ["a"] * 2049}, {}])
def test_bad_inputs_are_400s_naming_the_field(http, body):
    param = "encoding_format" if "encoding_format" in body else "input"
    assert_error(http.post("/v1/embeddings", json=body), 400, param)


def test_scores_pair_one_to_n_and_n_to_n(http):
    one = vectors(http.post("/v1/embeddings", json={"input": ["abc", *DOCUMENTS]}))
    scored = http.post("/v1/score", json={"model": "tiny", "text_1": "abc", "text_2": DOCUMENTS}).json()
    assert scored["object"] == "list" and [d["index"] for d in scored["data"]] == [0, 1, 2, 3]
    assert [d["object"] for d in scored["data"]] == ["score"] * 4
    np.testing.assert_allclose([d["score"] for d in scored["data"]], [cosine(one[0], v) for v in one[1:]], atol=1e-6)
    assert scored["usage"]["prompt_tokens"] == 3 + sum(map(len, DOCUMENTS))
    pairs = http.post("/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]}).json()
    np.testing.assert_allclose([d["score"] for d in pairs["data"]],
                               [cosine(one[1], one[3]), cosine(one[2], one[4])], atol=1e-6)
    error = assert_error(http.post("/v1/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[:3]}), 400,
                         "text_2")
    assert "1:1, 1:N or N:N" in error["message"]
    assert_error(http.post("/v1/score", json={"text_1": [], "text_2": "a"}), 400, "text_1")


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_sorts_keeps_top_n_and_returns_documents(http, path):
    one = vectors(http.post("/v1/embeddings", json={"input": ["abc", *DOCUMENTS]}))
    expected = sorted(range(4), key=lambda i: -cosine(one[0], one[i + 1]))
    body = http.post(path, json={"query": "abc", "documents": DOCUMENTS}).json()
    assert [r["index"] for r in body["results"]] == expected
    assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in expected]
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and body["usage"]["total_tokens"] == 3 + sum(map(len, DOCUMENTS))
    top = http.post(path, json={"query": "abc", "documents": [{"text": d} for d in DOCUMENTS], "top_n": 2,
                                "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == expected[:2] and "document" not in top["results"][0]
    assert_error(http.post(path, json={"query": "abc", "documents": []}), 400, "documents")
    assert_error(http.post(path, json={"query": "", "documents": ["a"]}), 400, "query")
    assert_error(http.post(path, json={"query": "a", "documents": ["a"], "top_n": -1}), 400, "top_n")


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("/v1/messages", {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/responses", {"input": "x"}),
])
def test_generation_on_a_pooling_model_is_a_400_that_says_so(pooled, http, path, body):
    server, fake = pooled
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert "tiny is a pooling model" in response.text and "/v1/embeddings" in response.text
    assert server.call(lambda: fake.submitted) == []


@pytest.mark.parametrize("path,body", [("/v1/embeddings", {"input": "x"}),
                                       ("/v1/score", {"text_1": "x", "text_2": "y"}),
                                       ("/rerank", {"query": "x", "documents": ["y"]})])
def test_pooling_on_a_generative_model_is_a_400_that_says_so(served, path, body):
    server, _ = served                   # the shared generative fake (tests/frontend/conftest.py)
    response = httpx.post(server.url + path, json=body)
    error = assert_error(response, 400, "model")
    assert "tiny is a generative model" in error["message"] and "--runner pooling" in error["message"]


def test_models_list_the_pooling_model(http):
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny"]


def test_auth_applies_to_the_pooling_routes(pooling_model):
    server, _ = serve_pooling(pooling_model, server=ServerConfig(log_stats_interval=0, api_key="k3y"))
    with server:
        for path in POOLING_ROUTES:
            assert httpx.post(server.url + path, json={"input": "x"}).status_code == 401
        ok = httpx.post(server.url + "/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer k3y"})
        assert ok.status_code == 200


def test_a_client_that_leaves_aborts_every_input(pooling_model):
    server, fake = serve_pooling(pooling_model, step_delay=30)
    with server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/embeddings", json={"input": ["a", "b", "c"]}, timeout=0.5)
        assert wait_for(lambda: len(server.call(lambda: fake.aborted)) == 3)
        assert server.call(lambda: fake.num_unfinished) == 0


def test_a_dead_engine_is_a_503(pooling_model):
    server, fake = serve_pooling(pooling_model, step_delay=30)
    with server:
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(r=httpx.post(
            server.url + "/v1/rerank", json={"query": "a", "documents": ["b", "c"]}, timeout=10)))
        thread.start()
        assert wait_for(lambda: server.call(lambda: len(fake.pooling)) == 3)
        server.call(fake.die)
        thread.join(10)
        error = assert_error(answer["r"], 503, None)
        assert "executor 0 died" in error["message"]
        assert_error(httpx.post(server.url + "/v1/embeddings", json={"input": "x"}), 503, None)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_fuzzing_the_pooling_routes_finds_no_server_error(pooled, mode):
    server, _ = pooled
    schema = schemathesis.openapi.from_dict(httpx.get(server.url + "/openapi.json").json())
    fuzzed = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path not in POOLING_ROUTES:
            continue

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=6, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def run(case):
            response = case.call(base_url=server.url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                     negative_data_rejection])

        run()
        fuzzed += 1
    assert fuzzed == len(POOLING_ROUTES)
    assert httpx.get(server.url + "/health").status_code == 200
