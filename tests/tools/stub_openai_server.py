"""A tiny streaming OpenAI-compatible server with known delays, for testing the benchmark client.

It runs a raw asyncio HTTP/1.1 server on a free loopback port in a background thread and records, per
request, when it arrived and when each token chunk was written (time.perf_counter(), the clock the client
uses too; stamped just before the write, so a client receipt is never earlier), plus the most requests
it ever had in flight. A request's behaviour is chosen by a `mode=NAME` word in its prompt:

  ok (default)   first token after ttft_ms, then one token chunk every itl_ms, usage, [DONE]
  slow           as ok, but the first token after slow_ttft_ms
  no_usage       as ok, without the usage chunk
  no_done        as ok, but the stream ends without [DONE]
  error_event    two tokens, then an error event (and [DONE])
  drop           two tokens, then the connection is cut
  http500        an HTTP 500 with an OpenAI-shaped error body

Chat streams start with a role-only chunk sent at once, before any token, as real servers do. /v1/embeddings
answers one whole body after ttft_ms (http500 works there too).
Each token chunk carries TOKEN_TEXT; usage reports one prompt token per whitespace-separated word.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import dataclass, field

TOKEN_TEXT = " hello"
EARLY_TOKENS = 2  # tokens sent before error_event / drop strike
MODEL_NAME = "stub-model"


@dataclass
class StubRequest:
    """One request as the server saw it."""

    mode: str
    prompt: str
    body: dict
    arrival: float
    send_times: list[float] = field(default_factory=list)


class StubOpenAIServer:
    def __init__(
        self,
        ttft_ms: float = 50.0,
        itl_ms: float = 10.0,
        slow_ttft_ms: float = 250.0,
        done_delay_ms: float = 0.0,
        port: int = 0,
        model_root: str | None = None,
    ):
        self.ttft_s = ttft_ms / 1000.0
        self.itl_s = itl_ms / 1000.0
        self.slow_ttft_s = slow_ttft_ms / 1000.0
        self.done_delay_s = done_delay_ms / 1000.0
        self.requests: list[StubRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = port
        self.models_body = json.dumps(
            {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "root": model_root}]}
        ).encode()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def by_tag(self, tag: str) -> StubRequest:
        """The one measured request whose prompt holds `tag` (the last one: earlier ones are warm-ups)."""
        return [r for r in self.requests if tag in r.prompt.split()][-1]

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> StubOpenAIServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the stub server did not start within 10 s")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    # ------------------------------------------------------------------ HTTP
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode().split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)
                }
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if method == "GET" and path == "/v1/models":
                    self._reply(writer, 200, self.models_body)
                elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                    if not await self._completion(writer, json.loads(body), chat="chat" in path):
                        return
                elif method == "POST" and path == "/v1/embeddings":
                    await self._embedding(writer, json.loads(body))
                else:
                    self._reply(writer, 404, b'{"error": {"message": "no such route"}}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client closed the connection
        finally:
            writer.close()

    @staticmethod
    def _reply(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)

    async def _embedding(self, writer: asyncio.StreamWriter, body: dict) -> None:
        """One embedding, written whole after ttft_ms (its one send time); http500 fails it."""
        prompt = body["input"]
        match = re.search(r"mode=(\w+)", prompt)
        request = StubRequest(mode=match.group(1) if match else "ok", prompt=prompt, body=body,
                              arrival=time.perf_counter())
        self.requests.append(request)
        await asyncio.sleep(self.ttft_s)
        if request.mode == "http500":
            self._reply(writer, 500, b'{"error": {"message": "stub failure", "type": "InternalServerError"}}')
            return
        words = len(prompt.split())
        request.send_times.append(time.perf_counter())
        self._reply(writer, 200, json.dumps({"object": "list", "data": [
            {"index": 0, "object": "embedding", "embedding": [0.6, 0.8]}],
            "usage": {"prompt_tokens": words, "total_tokens": words}}).encode())

    async def _completion(self, writer: asyncio.StreamWriter, body: dict, chat: bool) -> bool:
        """Serve one streamed request; False when the connection was cut."""
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        match = re.search(r"mode=(\w+)", prompt)
        request = StubRequest(
            mode=match.group(1) if match else "ok", prompt=prompt, body=body, arrival=time.perf_counter()
        )
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(writer, request, body["max_tokens"], chat)
        finally:
            self.in_flight -= 1

    async def _stream(
        self, writer: asyncio.StreamWriter, request: StubRequest, num_tokens: int, chat: bool
    ) -> bool:
        mode = request.mode
        if mode == "http500":
            self._reply(writer, 500, b'{"error": {"message": "stub failure", "type": "InternalServerError"}}')
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )

        def event(payload: dict | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            line = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))

        if chat:
            event(
                {
                    "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    ]
                }
            )
        await asyncio.sleep(self.slow_ttft_s if mode == "slow" else self.ttft_s)
        for i in range(num_tokens):
            if i:
                await asyncio.sleep(self.itl_s)
            if i == EARLY_TOKENS and mode == "error_event":
                event({"error": {"message": "stub error mid-stream", "type": "InternalServerError"}})
                break
            if i == EARLY_TOKENS and mode == "drop":
                writer.transport.abort()
                return False
            finish = "length" if i == num_tokens - 1 else None
            choice = (
                {"index": 0, "delta": {"content": TOKEN_TEXT}} if chat else {"index": 0, "text": TOKEN_TEXT}
            )
            # stamped before the write: the client thread may run and stamp its receipt before this
            # thread resumes after it
            request.send_times.append(time.perf_counter())
            event({"object": "chunk", "choices": [{**choice, "finish_reason": finish}]})
        if mode not in ("no_usage", "error_event"):
            prompt_tokens = len(request.prompt.split())
            event(
                {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": num_tokens,
                        "total_tokens": prompt_tokens + num_tokens,
                    },
                }
            )
        if self.done_delay_s and mode != "error_event":  # the client stops reading at an error event
            await asyncio.sleep(self.done_delay_s)
        if mode != "no_done":
            event("[DONE]")
        writer.write(b"0\r\n\r\n")
        return True
