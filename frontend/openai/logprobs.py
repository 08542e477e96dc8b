"""Logprobs in the three shapes clients expect: completions', chat's and vLLM's prompt_logprobs.

Each TokenLogprobs row holds the chosen token first, then the top-k. Tokens are shown as their decoded
text, one token at a time (a token that is part of a multi-byte character shows as "\ufffd", as in vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.client.detokenizer import backend_tokenizer
from engine.outputs import TokenLogprobs

# JSON has no -inf (orjson would write null). A token masked by a grammar has logprob -inf: as the chosen
# token it is shown as -9999.0 (vLLM's clamp), and in a top-k list it is left out (it had no chance).
LOGPROB_FLOOR = -9999.0


def _shown(logprob: float) -> float:
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def _top(token_ids: Sequence[int], logprobs: Sequence[float]) -> list[tuple[int, float]]:
    return [(t, lp) for t, lp in zip(token_ids, logprobs, strict=True) if lp != -math.inf]


class TokenStrings:
    """Token id -> its text alone, cached: logprobs name the same few thousand tokens again and again."""

    __slots__ = ("_decode", "_cache")

    def __init__(self, tokenizer):
        self._decode = backend_tokenizer(tokenizer).decode
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._decode([token_id], skip_special_tokens=False)
            if len(self._cache) < 1 << 20:
                self._cache[token_id] = text
        return text


def completion_logprobs(token_ids: Sequence[int], rows: Sequence[TokenLogprobs | None], strs: TokenStrings,
                        text_offset: int = 0) -> tuple[dict, int]:
    """OpenAI completions' logprobs object for these tokens, and the text offset after them.

    A None row (the first token of an echoed prompt: nothing precedes it) has no logprob. top_logprobs
    holds the top-k and the chosen token, as vLLM does.
    """
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, row in zip(token_ids, rows, strict=False):
        token = strs(token_id)
        tokens.append(token)
        offsets.append(text_offset)
        text_offset += len(token)
        if row is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_shown(row.logprobs[0]))
        top = {strs(t): lp for t, lp in _top(row.token_ids[1:], row.logprobs[1:])}
        top.setdefault(token, _shown(row.logprobs[0]))
        top_logprobs.append(top)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": offsets}, text_offset


def chat_logprobs(rows: Sequence[TokenLogprobs], strs: TokenStrings, top_logprobs: int) -> dict:
    """OpenAI chat's {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""
    content = []
    for row in rows:
        token = strs(row.token_ids[0])
        top = []
        for t, lp in _top(row.token_ids[1:1 + top_logprobs], row.logprobs[1:1 + top_logprobs]):
            text = strs(t)
            top.append({"token": text, "logprob": lp, "bytes": list(text.encode())})
        content.append({"token": token, "logprob": _shown(row.logprobs[0]), "bytes": list(token.encode()),
                        "top_logprobs": top})
    return {"content": content}


def prompt_logprobs_json(rows: Sequence[TokenLogprobs | None], strs: TokenStrings) -> list[dict | None]:
    """vLLM's prompt_logprobs: per prompt position None or {token id: {logprob, rank, decoded_token}}."""
    out: list[dict | None] = []
    for row in rows:
        if row is None:
            out.append(None)
            continue
        entry = {}
        for column, (t, lp) in enumerate(zip(row.token_ids, row.logprobs, strict=True)):
            entry.setdefault(str(t), {"logprob": _shown(lp), "rank": row.rank if column == 0 else column,
                                      "decoded_token": strs(t)})
        out.append(entry)
    return out
