"""POST /v1/embeddings: OpenAI's embeddings API (with vLLM's extensions) over the embedding service
(frontend/embedding.py). Vectors are written as JSON floats, or as base64 of their little-endian float32 bytes
(`encoding_format: "base64"`, what the official Python client asks for by default)."""

from __future__ import annotations

import base64
import time

import numpy as np
from starlette.requests import Request

from frontend.embedding import EmbeddingService, split_inputs
from frontend.openai.protocol import MAX_POOLING_INPUTS, EmbeddingRequest
from frontend.serving_engine import OpenAIServing, ServingContext


class OpenAIServingEmbedding(OpenAIServing):
    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.embeddings = EmbeddingService(self)

    async def create_embedding(self, request: Request):
        req = await self.read(request, EmbeddingRequest)
        service = self.embeddings
        service.check_model()
        inputs = split_inputs(req.input, "input", MAX_POOLING_INPUTS)
        params = service.pooling_params(dimensions=req.dimensions, normalize=req.normalize,
                                        truncate_prompt_tokens=req.truncate_prompt_tokens)
        job = await service.prepare(request, {"input": inputs}, params, priority=req.priority,
                                    add_special_tokens=req.add_special_tokens)
        as_base64 = req.encoding_format == "base64"
        model, created, tokens = self.ctx.model_name, int(time.time()), job.prompt_tokens

        def body(vectors: list[np.ndarray]) -> dict:
            data = [{"index": i, "object": "embedding", "embedding": _base64(v) if as_base64 else v}
                    for i, v in enumerate(vectors)]
            return {"id": job.request_id, "object": "list", "created": created, "model": model, "data": data,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

        return service.respond(job, body)


def _base64(vector: np.ndarray) -> str:
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
