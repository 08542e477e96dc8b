"""Ollama's embedding routes over the one embedding service (frontend/embedding.py): POST /api/embed (`input`
a string or a list of strings; {"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"})
and the older POST /api/embeddings (one `prompt`; {"embedding"}).

`truncate` (Ollama's default true) cuts each input to max_model_len, as truncate_prompt_tokens -1 does on
/v1/embeddings; with false a too-long input is a 400 naming max_model_len, as is a too-long prompt on
/api/embeddings (which has no `truncate`: nothing is cut unasked). `dimensions` is Matryoshka's (a
400 naming it on a model without those sizes). An empty input answers at once with no vectors, as Ollama's
load request does. `options` are checked as on /api/chat and otherwise have no effect on a pooling model.
"""

from __future__ import annotations

import time

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from frontend.embedding import EmbeddingService, split_inputs
from frontend.http_responses import json_response
from frontend.ollama.handlers import OllamaServing
from frontend.ollama.keep_alive import parse_keep_alive
from frontend.ollama.options import read_options
from frontend.ollama.protocol import MAX_EMBED_INPUTS, OllamaEmbeddingsRequest, OllamaEmbedRequest
from frontend.ollama.wire import NS

REMEDY = "send \"truncate\": true to cut it to that length"
LEGACY_REMEDY = "use /api/embed, where \"truncate\": true cuts it to that length"


class OllamaEmbedding:
    """The two routes, on the Ollama handler's model card, residency and request reading."""

    def __init__(self, serving: OllamaServing):
        self.serving = serving
        self.service = EmbeddingService(serving)

    async def embed(self, request: Request) -> Response:
        arrival = time.monotonic()
        req = await self.serving.read(request, OllamaEmbedRequest)
        self._admit(req.options, req.model, req.keep_alive)
        if not req.input:
            return json_response({"model": req.model, "embeddings": []})
        service = self.service
        params = service.pooling_params(dimensions=req.dimensions,
                                        truncate_prompt_tokens=-1 if req.truncate else None)
        inputs = split_inputs(req.input, "input", MAX_EMBED_INPUTS)
        job = await service.prepare(request, {"input": inputs}, params, prefix="ollama-embed", remedy=REMEDY)

        def body(vectors: list[np.ndarray]) -> dict:
            return {"model": req.model, "embeddings": vectors,
                    "total_duration": int((time.monotonic() - arrival) * NS), "load_duration": 0,
                    "prompt_eval_count": job.prompt_tokens}

        return service.respond(job, body)

    async def embeddings(self, request: Request) -> Response:
        req = await self.serving.read(request, OllamaEmbeddingsRequest)
        self._admit(req.options, req.model, req.keep_alive)
        if not req.prompt:
            return json_response({"embedding": []})
        service = self.service
        params = service.pooling_params()       # this route has no `truncate`: a too-long prompt is refused
        job = await service.prepare(request, {"prompt": [req.prompt]}, params, prefix="ollama-embed",
                                    remedy=LEGACY_REMEDY)
        return service.respond(job, lambda vectors: {"embedding": vectors[0]})

    def _admit(self, options: dict | None, model: str, keep_alive) -> None:
        """What every embedding request passes first: a pooling model (400 naming its kind), its options and
        keep_alive checked."""
        self.service.check_model()
        read_options(options)
        self.serving.residency.keep_alive(model, parse_keep_alive(keep_alive))
