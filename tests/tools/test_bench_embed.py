"""`ringserve bench embed`: deterministic sentences, and one small run beside sentence-transformers that
reports both rates and agreeing vectors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.engine.pooling_models import tiny_encoder_fixture  # noqa: F401  (pytest fixture)
from tools.bench_embed import cli, make_sentences


def test_sentences_are_deterministic_words_of_the_vocabulary(tiny_encoder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder())
    first, again = make_sentences(tokenizer, 20, seed=3), make_sentences(tokenizer, 20, seed=3)
    assert first == again and first != make_sentences(tokenizer, 20, seed=4)
    vocab = tokenizer.get_vocab()
    assert all(s.endswith(".") and len(s.split()) >= 3 for s in first)
    assert all(word.lower().rstrip(".") in vocab for s in first for word in s.split())


def test_a_small_run_beside_sentence_transformers(tiny_encoder):
    result = CliRunner().invoke(cli, ["--model", str(tiny_encoder()), "--num-sentences", "12", "--repeats", "1",
                                      "--sentence-transformers", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sentences"] == 12 and report["ringserve_median"] > 0 and report["sentence_transformers_median"] > 0
    assert report["min_cosine"] >= 0.9999
