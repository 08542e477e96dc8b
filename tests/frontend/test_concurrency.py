"""Many streams at once: each gets exactly its own tokens, and the engine is left with nothing running."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from tests.frontend.fake_engine import SCRIPT
from tests.frontend.harness import serve_fake

STREAMS = 64


async def one_stream(client: httpx.AsyncClient, index: int) -> tuple[int, str, int, int]:
    max_tokens = 10 + index % 37
    body = {"prompt": f"request {index}", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    text, finishes, usage = [], 0, None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[len("data: "):])
            if chunk["choices"]:
                text.append(chunk["choices"][0]["text"])
                finishes += chunk["choices"][0]["finish_reason"] is not None
            else:
                usage = chunk["usage"]
    return max_tokens, "".join(text), finishes, usage["completion_tokens"]


async def run_streams(url: str) -> list[tuple[int, str, int, int]]:
    limits = httpx.Limits(max_connections=STREAMS)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        return await asyncio.gather(*(one_stream(client, i) for i in range(STREAMS)))


def test_64_concurrent_streams_complete_with_their_token_counts(tiny_model):
    server, fake = serve_fake(tiny_model, step_delay=0.002)
    with server:
        results = asyncio.run(run_streams(server.url))
        assert server.call(lambda: len(fake.running)) == 0
        assert server.call(lambda: len(fake.finished)) == STREAMS
    for max_tokens, text, finishes, completion_tokens in results:
        expected = (SCRIPT * 2)[:max_tokens]
        assert text == expected and finishes == 1 and completion_tokens == max_tokens
