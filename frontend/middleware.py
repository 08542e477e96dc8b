"""The server's own ASGI middleware: X-Request-Id on every response, and the API key check.

The key comes as "Authorization: Bearer KEY" (OpenAI clients) or as "x-api-key: KEY" (Anthropic clients).

Written as plain ASGI (not starlette's BaseHTTPMiddleware, which would buffer and re-wrap every streamed
chunk): per streamed chunk it costs one comparison.
"""

from __future__ import annotations

import hmac
import uuid

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend.errors import error_body_for

OPEN_PATHS = frozenset({"/health"})      # reachable without the API key (liveness probes)
MAX_REQUEST_ID_BYTES = 256


class ServerMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None = None, max_header_bytes: int = 16 * 1024):
        self.app = app
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self._expected_key = api_key.encode() if api_key else None
        self._max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = authorization = api_key = None
        header_bytes = 0
        for name, value in scope["headers"]:
            header_bytes += len(name) + len(value)
            if name == b"x-request-id":
                request_id = value
            elif name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
        id_header = (b"x-request-id", (request_id or uuid.uuid4().hex.encode())[:MAX_REQUEST_ID_BYTES])

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        # The HTTP parser bounds only headers that arrive in pieces; this bounds them all.
        if header_bytes > self._max_header_bytes:
            await _refuse(send_with_id, scope["path"], 431, f"request headers exceed {self._max_header_bytes} bytes")
            return
        if (self._expected is not None and scope["path"] not in OPEN_PATHS
                and not self._authorized(authorization, api_key)):
            await _refuse(send_with_id, scope["path"], 401, "invalid or missing API key: send "
                          "'Authorization: Bearer <key>' or 'x-api-key: <key>'", [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send_with_id)

    def _authorized(self, authorization: bytes | None, api_key: bytes | None) -> bool:
        # compare_digest takes time independent of where the bytes differ (CVE-2025-59425 was this leak).
        if authorization is not None and hmac.compare_digest(authorization, self._expected):
            return True
        return api_key is not None and hmac.compare_digest(api_key, self._expected_key)


async def _refuse(send: Send, path: str, status: int, message: str, headers: list | None = None) -> None:
    """An error before the body was read: the connection closes after it (see errors.error_response)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"), *(headers or ())]})
    await send({"type": "http.response.body", "body": orjson.dumps(error_body_for(path, status, message))})
