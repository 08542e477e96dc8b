"""The characters-per-token bound (engine/client/token_bounds.py): it must hold for every text, so it is
checked against the worst texts for each real tokenizer (runs of each tokenizer's longest token, composing
Unicode, random text), and tokenizers whose parts allow no bound must get none."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from engine.client.token_bounds import composition_factor, max_chars_per_token
from engine.config import EngineConfig
from engine.models.bundled import find_smollm2
from tests.conftest import shared_path


@pytest.fixture(scope="module")
def real_tokenizers() -> dict:
    from transformers import AutoTokenizer

    from engine.client.tokenizer import load_tokenizer

    found = {}
    for family in ("qwen3", "llama3"):
        path = shared_path(f"models/tokenizers/{family}")
        if path.exists():
            found[family] = AutoTokenizer.from_pretrained(str(path))
    if find_smollm2() is not None:
        found["smollm2-gguf"] = load_tokenizer(EngineConfig(model="smollm2-135m-instruct").finalize())
    return found


def worst_texts(tokenizer) -> list[str]:
    backend = tokenizer.backend_tokenizer
    vocab = backend.get_vocab(with_added_tokens=True)
    longest = sorted(vocab, key=len)[-5:]
    rng = random.Random(0)
    texts = [tokenizer.decode([vocab[token]]) * 20 for token in longest]
    texts += ["ΰ" * 500, "\u03c5\u0308\u0301" * 500, "\u1100\u1161\u11a8" * 500, " " * 5000, "a" * 5000,
              "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(5000))]
    return texts


def test_no_text_has_fewer_tokens_than_the_bound_allows(real_tokenizers):
    tokenizers = real_tokenizers
    if not tokenizers:
        pytest.skip("no real tokenizer available")
    for name, tokenizer in tokenizers.items():
        bound = max_chars_per_token(tokenizer)
        assert bound is not None, name
        for text in worst_texts(tokenizer):
            tokens = len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)
            assert len(text) <= tokens * bound, (name, text[:40], len(text), tokens, bound)


def test_the_bound_is_the_longest_token_times_what_normalization_may_compose(real_tokenizers):
    tokenizers = real_tokenizers
    if "qwen3" not in tokenizers:
        pytest.skip("../shared tokenizers are absent")
    # Qwen3: byte-level BPE (longest token 128 bytes) under NFC, which folds at most 3 characters into 2 bytes
    assert max_chars_per_token(tokenizers["qwen3"]) == 192
    assert max_chars_per_token(tokenizers["llama3"]) == 128          # no normalizer


def test_the_unicode_factors_are_measured():
    assert composition_factor(per_byte=False) == 4          # e.g. U+1F82 decomposes into 4 code points
    assert composition_factor(per_byte=True) == Fraction(3, 2)


def _tokenizer(model, normalizer=None, pre_tokenizer=None) -> Tokenizer:
    tokenizer = Tokenizer(model)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    return tokenizer


VOCAB = {"[UNK]": 0, "a": 1, "b": 2, "ab": 3}


@pytest.mark.parametrize("tokenizer", [
    _tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]")),                        # [UNK] stands for a word
    _tokenizer(models.Unigram([("a", -1.0), ("b", -1.0)], 0)),
    _tokenizer(models.BPE(VOCAB, [("a", "b")], unk_token="[UNK]", fuse_unk=True)),   # fused runs of unknowns
    _tokenizer(models.BPE(VOCAB, [("a", "b")]), normalizers.BertNormalizer()),     # drops control characters
    _tokenizer(models.BPE(VOCAB, [("a", "b")]), normalizers.Strip()),
    _tokenizer(models.BPE(VOCAB, [("a", "b")]), pre_tokenizer=pre_tokenizers.Whitespace()),   # drops spaces
    _tokenizer(models.BPE(VOCAB, [("a", "b")]),
               pre_tokenizer=pre_tokenizers.Split(" ", behavior="removed")),
], ids=["wordpiece", "unigram", "fused-unknowns", "bert-normalizer", "strip", "whitespace", "split-removed"])
def test_tokenizers_that_can_drop_or_swallow_text_get_no_bound(tokenizer):
    assert max_chars_per_token(tokenizer) is None


def test_sentencepiece_style_bpe_is_bounded_by_its_spelled_tokens():
    vocab = {**{f"<0x{b:02X}>": b for b in range(256)}, "▁ab": 256, "a": 257, "b": 258, "<unk>": 259}
    tokenizer = _tokenizer(models.BPE(vocab, [], unk_token="<unk>", fuse_unk=True, byte_fallback=True),
                           normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]))
    assert max_chars_per_token(tokenizer) == len("<0x00>")
