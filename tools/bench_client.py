"""One streamed request against an OpenAI-compatible server, timed on the client side (or, for
/v1/embeddings, one whole request: its latency is the time to the whole body).

The per-chunk loop only splits SSE lines, parses each event with orjson and stamps the arrival time of
every token chunk; TTFT, ITL and token counts are derived after the run (bench_metrics), so the client
spends as little CPU as possible while the server under test shares the machine.

A token chunk is an event with a non-empty `choices` list, as in vLLM's benchmark (its text may be empty,
e.g. for a special token), except the chat role preamble (a delta carrying only the role), which carries
no token. A request fails on an HTTP error, an error event, an exception (a dropped connection, a
timeout), a stream that ends without `data: [DONE]`, or a stream without any token chunk.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import orjson

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "embeddings": "/v1/embeddings"}
ERROR_BODY_CHARS = 300


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request; times are time.perf_counter() seconds."""

    prompt_len: int  # the server's usage.prompt_tokens when it sends one
    start_time: float = 0.0  # when the request was sent
    token_times: list[float] = field(default_factory=list)  # arrival of each token chunk
    output_tokens: int = 0  # usage.completion_tokens; 0 = not reported
    generated_text: str = ""
    success: bool = False
    error: str = ""
    queue_time: float = 0.0  # spent waiting for a --max-concurrency slot
    generates: bool = True  # False for an embedding: no output tokens to count

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.start_time if self.token_times else 0.0

    @property
    def latency(self) -> float:
        """E2EL: from sending to the last token chunk (not to [DONE], as vLLM)."""
        return self.token_times[-1] - self.start_time if self.token_times else 0.0


def build_payload(endpoint: str, model: str, prompt: str, max_tokens: int, ignore_eos: bool,
                  extra: dict | None = None) -> bytes:
    """The JSON body of a streamed request with usage in the last chunk (plus `extra` fields, e.g. a
    structured-outputs constraint)."""
    body: dict = {"model": model}
    if endpoint == "embeddings":       # one input, vectors as JSON floats (what every embedding server writes)
        return orjson.dumps({**body, "input": prompt, "encoding_format": "float", **(extra or {})})
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension to the OpenAI API
    if extra:
        body.update(extra)
    return orjson.dumps(body)


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    payload: bytes,
    prompt_len: int,
    endpoint: str,
    timeout_s: float,
) -> RequestRecord:
    """POST one request (streamed, but for embeddings) and record it; never raises for a failed request.
    endpoint: "completions", "chat" or "embeddings" (a chat stream's role preamble is no token)."""
    if endpoint not in ("completions", "chat", "embeddings"):
        raise ValueError(f"endpoint must be 'completions', 'chat' or 'embeddings', not {endpoint!r}")
    record = RequestRecord(prompt_len=prompt_len)
    work = (_embed(client, url, payload, record) if endpoint == "embeddings"
            else _stream(client, url, payload, endpoint == "chat", record))
    try:
        await asyncio.wait_for(work, timeout_s)
    except asyncio.TimeoutError:
        record.success, record.error = False, f"timed out after {timeout_s:g} s"
    except Exception as e:  # a benchmark records every client-side failure instead of stopping the run
        record.success, record.error = False, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return record


async def _stream(
    client: httpx.AsyncClient, url: str, payload: bytes, chat: bool, record: RequestRecord
) -> None:
    token_times = record.token_times
    texts: list[str] = []
    done = False
    error = ""
    buffer = b""
    record.start_time = time.perf_counter()
    async with client.stream("POST", url, content=payload) as response:
        if response.status_code != 200:
            body = (await response.aread())[:ERROR_BODY_CHARS].decode("utf-8", "replace")
            record.error = f"HTTP {response.status_code}: {body}"
            return
        async for data in response.aiter_bytes():
            now = time.perf_counter()
            *lines, buffer = (buffer + data).split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments (pings), event: fields
                body = line[5:].strip()
                if body == b"[DONE]":
                    done = True
                    continue
                event = orjson.loads(body)
                if "error" in event:
                    error = _error_message(event["error"])
                    break
                choices = event.get("choices")
                if choices:
                    choice = choices[0]
                    if chat:
                        delta = choice.get("delta") or {}
                        text = delta.get("content")
                        if not text and "role" in delta and choice.get("finish_reason") is None:
                            continue  # the role preamble: no token yet
                    else:
                        text = choice.get("text")
                    token_times.append(now)
                    if text:
                        texts.append(text)
                usage = event.get("usage")
                if usage:
                    record.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        record.prompt_len = usage["prompt_tokens"]
            if error:
                break
    record.generated_text = "".join(texts)
    if error:
        record.error = f"error event in the stream: {error}"
    elif not done:
        record.error = "the stream ended without data: [DONE]"
    elif not token_times:
        record.error = "the stream carried no token chunk"
    else:
        record.success = True


async def _embed(client: httpx.AsyncClient, url: str, payload: bytes, record: RequestRecord) -> None:
    """One embeddings request: its one "token" time is when the whole body arrived (E2EL = TTFT)."""
    record.generates = False
    record.start_time = time.perf_counter()
    response = await client.post(url, content=payload)
    body = response.content
    done = time.perf_counter()
    if response.status_code != 200:
        record.error = f"HTTP {response.status_code}: {body[:ERROR_BODY_CHARS].decode('utf-8', 'replace')}"
        return
    data = orjson.loads(body)
    if not data.get("data") or not data["data"][0].get("embedding"):
        record.error = "the response carried no embedding"
        return
    record.token_times.append(done)
    usage = data.get("usage") or {}
    if usage.get("prompt_tokens") is not None:
        record.prompt_len = usage["prompt_tokens"]
    record.success = True


def _error_message(error) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
