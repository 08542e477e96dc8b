"""Turning a request's text into token ids within the context's bounds: what every API handler shares.

- A prompt whose length in characters makes it certain to exceed max_model_len is refused untokenized
  (ctx.chars_per_token: the most characters one token covers, engine/client/token_bounds.py).
- Short texts are tokenized inline; long ones on the context's small tokenizer pool with `encode_batch`,
  which releases the GIL (`encode` holds it for the whole text), so the event loop keeps serving.
- Chat messages are rendered by the chat template in a worker thread, its output bounded by the same limit.
"""

from __future__ import annotations

import asyncio

from frontend.chat.template import TemplateOutputTooLong, template_messages
from frontend.errors import invalid
from frontend.chat.protocol import ChatCompletionRequest, TokenizeRequest

INLINE_TOKENIZE_CHARS = 8192
MAX_TEMPLATE_OUTPUT_CHARS = 64 << 20       # a chat template's output, when the tokenizer gives no tighter bound


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

    async def chat_prompt(self, req: ChatCompletionRequest | TokenizeRequest, add_special_tokens: bool) -> list[int]:
        """req.messages rendered by the chat template and tokenized, in a worker thread (Jinja is slow)."""
        return (await self.render_chat(req, add_special_tokens))[1]

    async def render_chat(self, req: ChatCompletionRequest | TokenizeRequest, add_special_tokens: bool,
                          tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """(prompt text, token ids) of req.messages through the chat template, with the request's
        chat_template_kwargs over --default-chat-template-kwargs; rendered in a worker thread."""
        template = self.ctx.chat_template
        if template is None:
            raise invalid("this model has no chat template; start the server with --chat-template", "messages")
        rendered = template_messages(req.messages)
        extra = {**self.ctx.config.default_chat_template_kwargs, **(req.chat_template_kwargs or {})}
        max_chars = self.ctx.max_prompt_chars or MAX_TEMPLATE_OUTPUT_CHARS

        def render() -> str:
            try:
                return template.render(rendered, add_generation_prompt=req.add_generation_prompt,
                                       continue_final_message=req.continue_final_message, extra=extra,
                                       tools=tools, max_chars=max_chars)
            except TemplateOutputTooLong as e:
                self.check_prompt_chars(e.length, "messages")
                raise invalid(f"the chat template's output exceeds {max_chars} characters", "messages") from None

        text = await asyncio.to_thread(render)
        return text, (await self.tokenize_prompts([text], add_special_tokens, "messages"))[0]

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.ctx.vocab_size
        if ids and (max(ids) >= vocab or min(ids) < 0):
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise invalid(f"token id {bad} is outside the vocabulary [0, {vocab})", param)
