"""POST /v1/score (vLLM's: text_1 against text_2, paired 1:1, 1:N or N:N) and POST /v1/rerank and /rerank
(vLLM's, in Jina's and Cohere's shape: documents by relevance to a query, best first) over the embedding
service (frontend/embedding.py). On an embedding model a score is the cosine similarity of the two texts'
embeddings (engine/client/scoring.py); each distinct text is embedded once."""

from __future__ import annotations

import time

import numpy as np
from starlette.requests import Request

from engine.client.scoring import pair_scores, rank_documents, score_pairs
from frontend.embedding import EmbeddingService, split_inputs
from frontend.errors import invalid
from frontend.openai.protocol import MAX_POOLING_INPUTS, RerankDocument, RerankRequest, ScoreRequest
from frontend.serving_engine import OpenAIServing, ServingContext


class OpenAIServingScores(OpenAIServing):
    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.embeddings = EmbeddingService(self)

    async def create_score(self, request: Request):
        req = await self.read(request, ScoreRequest)
        service = self.embeddings
        service.check_model()
        texts_1 = split_inputs(req.text_1, "text_1", MAX_POOLING_INPUTS)
        texts_2 = split_inputs(req.text_2, "text_2", MAX_POOLING_INPUTS)
        try:
            score_pairs(len(texts_1), len(texts_2))
        except ValueError as e:
            raise invalid(str(e), "text_2") from None
        params = service.pooling_params(truncate_prompt_tokens=req.truncate_prompt_tokens)
        job = await service.prepare(request, {"text_1": texts_1, "text_2": texts_2}, params, priority=req.priority,
                                    prefix="score")
        split, model, created, tokens = len(texts_1), self.ctx.model_name, int(time.time()), job.prompt_tokens

        def body(vectors: list[np.ndarray]) -> dict:
            scores = pair_scores(vectors[:split], vectors[split:])
            data = [{"index": k, "object": "score", "score": s} for k, s in enumerate(scores)]
            return {"id": job.request_id, "object": "list", "created": created, "model": model, "data": data,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}

        return service.respond(job, body)

    async def create_rerank(self, request: Request):
        req = await self.read(request, RerankRequest)
        service = self.embeddings
        service.check_model()
        query = split_inputs(req.query, "query", 1)
        documents = split_inputs([d.text if isinstance(d, RerankDocument) else d for d in req.documents],
                                 "documents", MAX_POOLING_INPUTS)
        params = service.pooling_params(truncate_prompt_tokens=req.truncate_prompt_tokens)
        job = await service.prepare(request, {"query": query, "documents": documents}, params,
                                    priority=req.priority, prefix="rerank")
        model, tokens, top_n, with_text = self.ctx.model_name, job.prompt_tokens, req.top_n, req.return_documents

        def body(vectors: list[np.ndarray]) -> dict:
            results = []
            for ranked in rank_documents(pair_scores(vectors[:1], vectors[1:]), top_n):
                result = {"index": ranked.index, "relevance_score": ranked.score}
                if with_text:
                    result["document"] = {"text": documents[ranked.index]}
                results.append(result)
            return {"id": job.request_id, "model": model, "results": results,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

        return service.respond(job, body)

