"""POST /tokenize and /detokenize, in vLLM's shapes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from frontend.chat.preparation import ChatPreparation
from frontend.errors import invalid
from frontend.http_responses import json_response
from frontend.openai.protocol import DetokenizeRequest, TokenizeRequest
from frontend.serving_engine import OpenAIServing, ServingContext


class OpenAIServingTokenization(OpenAIServing):
    """{"prompt": ...} or {"messages": [...]} -> {"count", "max_model_len", "tokens", "token_strs"}."""

    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.chat = ChatPreparation(self)

    async def create_tokenize(self, request: Request) -> Response:
        req = await self.read(request, TokenizeRequest)
        if (req.prompt is None) == (req.messages is None):
            raise invalid("give exactly one of prompt and messages", "prompt")
        if req.prompt is not None:
            add_special = True if req.add_special_tokens is None else req.add_special_tokens
            (tokens,) = await self.tokenize_prompts([req.prompt], add_special)
        else:
            tokens = (await self.chat.render(req, bool(req.add_special_tokens)))[1]
        strs = [self.ctx.token_strings(t) for t in tokens] if req.return_token_strs else None
        return json_response({"count": len(tokens), "max_model_len": self.ctx.max_model_len, "tokens": tokens,
                              "token_strs": strs})

    async def create_detokenize(self, request: Request) -> Response:
        req = await self.read(request, DetokenizeRequest)
        self.check_token_ids(req.tokens, "tokens")
        return json_response({"prompt": self.decode(req.tokens)})
