"""The most characters of text one token can stand for, so that a prompt certain to exceed the context is
refused before it is tokenized (tokenizing megabytes takes seconds of CPU).

For a text of C characters tokenized into T tokens, C <= T * bound must hold for every text, so the bound
is derived from how the tokenizer works, not measured:
- each token covers the characters of its own string in the vocabulary, or fewer: a byte-level BPE token
  string has one character per byte (and a character is at least one byte); a SentencePiece-style string
  spells its text with "▁" for a space; byte-fallback tokens ("<0x41>") cover one byte with six
  characters; an added token covers its content. So the longest string bounds what any token covers in the
  text the model sees (normalized and pre-tokenized);
- normalization must not shrink the text beyond a known factor: NFC/NFKC compose at most as many characters
  into one character c as c's canonical decomposition has: at most 4 characters per character, and (what
  matters when tokens are counted in bytes) at most 3 per 2 bytes of UTF-8 (both measured from
  `unicodedata`); lowercasing, NFD/NFKD, prepending and replacing one string by an equal or longer one never
  shrink it;
- nothing may delete text or stand for an unbounded run of it: normalizers that strip or drop characters
  (BERT's, Strip, SentencePiece's precompiled maps), pre-tokenizers that remove whitespace, WordPiece's
  [UNK] for a whole word, Unigram models, and BPE models that fuse unknown characters into one unknown token
  give no bound (None), and such prompts are only ever tokenized (off the event loop) to be measured.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import unicodedata
from fractions import Fraction

_SAFE_NORMALIZERS = frozenset({"NFD", "NFKD", "Lowercase", "Prepend"})
_COMPOSING_NORMALIZERS = frozenset({"NFC", "NFKC"})
_SAFE_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split", "UnicodeScripts"})


def max_chars_per_token(tokenizer) -> int | None:
    """An upper bound on the characters of input text one token of `tokenizer` (a Hugging Face fast
    tokenizer or a `tokenizers.Tokenizer`) covers; None when the tokenizer's parts allow no such bound."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    model = backend.model
    if type(model).__name__ != "BPE" or not _bpe_is_bounded(model, backend):
        return None
    pre_tokenizer = _state(backend.pre_tokenizer)
    if not _pre_tokenizer_keeps_text(pre_tokenizer):
        return None
    factor = _normalizer_factor(_state(backend.normalizer), per_byte=_counts_bytes(pre_tokenizer))
    if factor is None:
        return None
    longest = max(len(token) for token in backend.get_vocab(with_added_tokens=True))
    return math.ceil(factor * max(longest, 1))


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def _bpe_is_bounded(model, backend) -> bool:
    """An unknown-token BPE that fuses runs of unknown characters into one token covers unbounded text,
    unless byte fallback spells every unknown character in byte tokens instead."""
    if model.unk_token is None or not model.fuse_unk:
        return True
    vocab = backend.get_vocab()
    return bool(model.byte_fallback) and all(f"<0x{b:02X}>" in vocab for b in range(256))


def _counts_bytes(pre_tokenizer: dict | None) -> bool:
    """Byte-level BPE: token strings spell bytes, one character each."""
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_counts_bytes(part) for part in pre_tokenizer.get("pretokenizers", ()))
    return pre_tokenizer.get("type") == "ByteLevel"


def _normalizer_factor(state: dict | None, per_byte: bool) -> Fraction | None:
    """How many input characters one normalized character (or byte, per_byte) may stand for; None: no bound."""
    if state is None:
        return Fraction(1)
    kind = state.get("type")
    if kind == "Sequence":
        factor = Fraction(1)
        for part in state.get("normalizers", ()):
            inner = _normalizer_factor(part, per_byte)
            if inner is None:
                return None
            factor *= inner
        return factor
    if kind in _SAFE_NORMALIZERS:
        return Fraction(1)
    if kind in _COMPOSING_NORMALIZERS:
        return composition_factor(per_byte)
    if kind == "Replace":
        pattern = state.get("pattern", {})
        literal = pattern.get("String")
        if literal and len(state.get("content", "")) >= len(literal):
            return Fraction(1)
    return None


def _pre_tokenizer_keeps_text(state: dict | None) -> bool:
    if state is None:
        return True
    kind = state.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps_text(part) for part in state.get("pretokenizers", ()))
    if kind not in _SAFE_PRE_TOKENIZERS:
        return False
    return state.get("behavior") != "Removed"


@functools.cache
def composition_factor(per_byte: bool) -> Fraction:
    """The most characters canonical composition turns into one character c (len of c's decomposition),
    per character of c or per byte of c's UTF-8. (Characters that decompose into one are 1 either way.)"""
    best = Fraction(1)
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        parts = len(unicodedata.normalize("NFD", c))
        if parts > 1:
            best = max(best, Fraction(parts, len(c.encode()) if per_byte else 1))
    return best
