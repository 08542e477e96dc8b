"""GET /v1/models: the one model this server serves (its name, never where its files live)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from frontend.http_responses import json_response
from frontend.serving_engine import ServingContext


class OpenAIServingModels:
    def __init__(self, ctx: ServingContext):
        self.ctx = ctx
        self.created = int(time.time())

    async def list_models(self, request: Request) -> Response:
        ctx = self.ctx
        # root: the model's name, never where its files live on this machine
        card = {"id": ctx.model_name, "object": "model", "created": self.created, "owned_by": "ringserve",
                "root": ctx.model_name, "parent": None, "max_model_len": ctx.max_model_len}
        return json_response({"object": "list", "data": [card]})
