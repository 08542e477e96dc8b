"""Scores and reranking over an embedding model, shared by the offline `LLM` and the server's endpoints.

For an embedding model a score is the cosine similarity of two texts' embeddings (vLLM's /score and /rerank
on an embedding model). Pairing follows vLLM: one text against one (1:1), one against N (1:N), or N against N
pairwise (N:N). Reranking scores a query against each document and returns them best first. The async helpers
run every input through `EngineClient.encode` at once, so the engine batches them as one workload.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from engine.sampling_params import PoolingParams

COSINE_EPS = 1e-8           # torch.nn.functional.cosine_similarity's


@dataclass(slots=True)
class RankedDocument:
    index: int                      # the document's position in the request
    score: float


def score_pairs(num_1: int, num_2: int) -> list[tuple[int, int]]:
    """The (i, j) pairs scored for inputs of num_1 and num_2 texts: 1:1, 1:N or N:N."""
    if num_1 == 0 or num_2 == 0:
        raise ValueError("score needs at least one text on each side")
    if num_1 == 1:
        return [(0, j) for j in range(num_2)]
    if num_1 != num_2:
        raise ValueError(f"score inputs must be 1:1, 1:N or N:N; got {num_1} texts against {num_2}")
    return [(i, i) for i in range(num_1)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """a . b / max(|a| |b|, eps), accumulated in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / max(float(np.linalg.norm(a) * np.linalg.norm(b)), COSINE_EPS))


def pair_scores(vectors_1: list[np.ndarray], vectors_2: list[np.ndarray]) -> list[float]:
    """The cosine score of each pair score_pairs() makes of the two sides."""
    return [cosine(vectors_1[i], vectors_2[j]) for i, j in score_pairs(len(vectors_1), len(vectors_2))]


def rank_documents(scores: list[float], top_n: int | None = None) -> list[RankedDocument]:
    """Documents by score, best first (ties keep request order), the first top_n (None or 0: all)."""
    if top_n is not None and top_n < 0:
        raise ValueError(f"top_n must not be negative, got {top_n}")
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [RankedDocument(i, scores[i]) for i in order[: top_n or None]]


async def embed(client, prompts: list[list[int]], params: PoolingParams | None, request_id: str) -> list[np.ndarray]:
    """The vectors of tokenized prompts, all submitted at once (request ids `request_id-i`)."""
    async def one(i: int, prompt: list[int]) -> np.ndarray:
        async for output in client.encode(f"{request_id}-{i}", prompt, params):
            return output.outputs.data
        raise RuntimeError(f"pooling request {request_id}-{i} ended without a result")

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


async def score(client, prompts_1: list[list[int]], prompts_2: list[list[int]], params: PoolingParams | None,
                request_id: str) -> list[float]:
    """Cosine scores of tokenized texts, paired 1:1, 1:N or N:N (checked before anything runs)."""
    score_pairs(len(prompts_1), len(prompts_2))
    vectors = await embed(client, [*prompts_1, *prompts_2], params, request_id)
    return pair_scores(vectors[: len(prompts_1)], vectors[len(prompts_1):])


async def rerank(client, query: list[int], documents: list[list[int]], top_n: int | None,
                 params: PoolingParams | None, request_id: str) -> list[RankedDocument]:
    """Tokenized documents ranked by their score against the query, best first, the first top_n."""
    rank_documents([], top_n)                       # a bad top_n fails before anything runs
    return rank_documents(await score(client, [query], documents, params, request_id), top_n)
