"""Turning a request's text into token ids within the context's bounds: what every API handler shares.

- A prompt whose length in characters makes it certain to exceed max_model_len is refused untokenized
  (ctx.chars_per_token: the most characters one token covers, engine/client/token_bounds.py).
- Short texts are tokenized inline; long ones on the context's small tokenizer pool with `encode_batch`,
  which releases the GIL (`encode` holds it for the whole text), so the event loop keeps serving.
- Chat messages are rendered by the chat template (frontend/chat/preparation.py) in a worker thread, its
  output bounded by the same limit, then tokenized here.
"""

from __future__ import annotations

import asyncio

from frontend.errors import invalid

INLINE_TOKENIZE_CHARS = 8192


class PromptPreparation:
    """Mixed into the API handlers (frontend/serving_engine.OpenAIServing), which set `ctx` (the
    ServingContext) and the tokenizer's `_encode`, `_encode_batch` and `_decode`."""

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Inline, for short texts: the tokenizers library's `encode` holds the GIL while it works."""
        return self._encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """For long texts, in a worker thread: `encode_batch` releases the GIL (`encode` does not), so the
        event loop keeps serving every other request meanwhile."""
        return [encoding.ids for encoding in self._encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._decode(ids, skip_special_tokens=skip_special_tokens)

    def check_prompt_chars(self, length: int, param: str) -> None:
        """Refuse, before tokenizing, a prompt whose length in characters makes it certain to exceed the
        context (no token of this tokenizer covers more than ctx.chars_per_token characters)."""
        limit = self.ctx.max_prompt_chars
        if limit is not None and length > limit:
            raise invalid(f"the prompt has {length} characters, and no token of this model's tokenizer covers "
                          f"more than {self.ctx.chars_per_token}, so it has more tokens than this model's maximum "
                          f"context length of {self.ctx.max_model_len}", param)

    async def tokenize_prompts(self, texts: list[str], add_special_tokens: bool,
                               param: str = "prompt") -> list[list[int]]:
        """Prompts certain to exceed the context are refused untokenized; short ones are tokenized inline,
        long ones off the event loop, a few at a time (tokenizing megabytes holds that much memory)."""
        for text in texts:
            self.check_prompt_chars(len(text), param)
        if sum(map(len, texts)) < INLINE_TOKENIZE_CHARS:
            return [self.tokenize(text, add_special_tokens) for text in texts]
        return await asyncio.get_running_loop().run_in_executor(self.ctx.tokenizer_pool, self.tokenize_batch,
                                                                texts, add_special_tokens)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.ctx.vocab_size
        if ids and (max(ids) >= vocab or min(ids) < 0):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise invalid(f"token id {bad} is outside the vocabulary [0, {vocab})", param)
