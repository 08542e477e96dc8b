"""The server's own ASGI middleware, in the order it checks a request:

1. X-Request-Id: echoed on every response (one is made up when the request has none).
2. Headers larger than max_header_bytes: 431.
3. The Host header (DNS rebinding: a web page whose name resolves to 127.0.0.1 sends its own name): a server
   listening on a loopback address accepts only loopback names (localhost, *.localhost, 127.x.y.z, [::1])
   plus `--allowed-hosts`; one listening elsewhere accepts any unless `--allowed-hosts` narrows it. 403.
4. The API key, on every route but /health and the chat page's static files (`public_paths`: the page asks
   for the key and sends it with each API request): "Authorization: Bearer KEY" (OpenAI and Ollama clients)
   or "x-api-key: KEY" (Anthropic clients), compared in constant time with every configured key. 401. The matching key's index
   goes into the scope (SCOPE_API_KEY), for what is kept per key (the Responses store).
5. A request body that is not JSON (CSRF: a browser sends text/plain, form and multipart bodies cross-site
   without asking first): 415 unless the Content-Type is application/json or */*+json. Bodyless requests
   pass.
6. Requests in progress beyond max_concurrent_requests: 503 with Retry-After (/health is never refused).

Written as plain ASGI (not starlette's BaseHTTPMiddleware, which would buffer and re-wrap every streamed
chunk): per streamed chunk it costs one comparison.
"""

from __future__ import annotations

import hmac
import ipaddress
import uuid

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend.errors import error_body_for

OPEN_PATHS = frozenset({"/health"})      # reachable without the API key (liveness probes)
MAX_REQUEST_ID_BYTES = 256
SCOPE_API_KEY = "ringserve.api_key"      # index of the API key that authorized the request (None: no keys)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class ServerMiddleware:
    def __init__(self, app: ASGIApp, api_keys: list[str] | None = None, max_header_bytes: int = 16 * 1024,
                 listen_host: str = "127.0.0.1", allowed_hosts: list[str] | None = None,
                 max_concurrent_requests: int = 1024, public_paths: frozenset[str] = frozenset()):
        self.app = app
        self._keyless = OPEN_PATHS | public_paths
        keys = api_keys or []
        self._bearers = [f"Bearer {key}".encode() for key in keys]
        self._keys = [key.encode() for key in keys]
        self._max_header_bytes = max_header_bytes
        self._allowed_hosts = {host.lower() for host in allowed_hosts or ()}
        self._any_host = "*" in self._allowed_hosts or (not self._allowed_hosts and not is_loopback(listen_host))
        self._max_requests = max_concurrent_requests
        self._in_progress = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = authorization = api_key = host = content_type = None
        has_body = False
        header_bytes = 0
        for name, value in scope["headers"]:
            header_bytes += len(name) + len(value)
            if name == b"x-request-id":
                request_id = value
            elif name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
            elif name == b"host":
                host = value
            elif name == b"content-type":
                content_type = value
            elif name == b"transfer-encoding" or name == b"content-length" and value.strip() not in (b"", b"0"):
                has_body = True
        id_header = (b"x-request-id", (request_id or uuid.uuid4().hex.encode())[:MAX_REQUEST_ID_BYTES])

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        path = scope["path"]
        # The HTTP parser bounds only headers that arrive in pieces; this bounds them all.
        if header_bytes > self._max_header_bytes:
            await _refuse(send_with_id, path, 431, f"request headers exceed {self._max_header_bytes} bytes")
            return
        if not self._any_host and host is not None and not self._host_allowed(host):
            shown = host.decode("latin-1")[:100]
            await _refuse(send_with_id, path, 403, f"Host {shown!r} is not allowed: this server listens on a "
                          "loopback address and answers only to loopback names; start it with --allowed-hosts "
                          "to accept others")
            return
        if self._keys and path not in self._keyless:
            key_index = self._key_index(authorization, api_key)
            if key_index is None:
                await _refuse(send_with_id, path, 401, "invalid or missing API key: send "
                              "'Authorization: Bearer <key>' or 'x-api-key: <key>'", [(b"www-authenticate", b"Bearer")])
                return
            scope[SCOPE_API_KEY] = key_index
        if has_body and scope["method"] in _BODY_METHODS and not is_json(content_type):
            shown = (content_type or b"none").decode("latin-1")[:100]
            await _refuse(send_with_id, path, 415, f"request bodies must be JSON (Content-Type: application/json), "
                          f"got Content-Type {shown!r}")
            return
        if path in OPEN_PATHS:
            await self.app(scope, receive, send_with_id)
            return
        if self._in_progress >= self._max_requests:
            await _refuse(send_with_id, path, 503, f"the server has {self._max_requests} requests in progress "
                          "(--max-concurrent-requests); retry shortly", [(b"retry-after", b"1")])
            return
        self._in_progress += 1
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._in_progress -= 1

    def _key_index(self, authorization: bytes | None, api_key: bytes | None) -> int | None:
        """The index of the key the request carries, comparing with every key (no early exit), each in
        constant time: how long this takes says nothing about the keys (CVE-2025-59425 was such a leak)."""
        found = None
        for i, (bearer, key) in enumerate(zip(self._bearers, self._keys, strict=True)):
            by_bearer = authorization is not None and hmac.compare_digest(authorization, bearer)
            by_key = api_key is not None and hmac.compare_digest(api_key, key)
            if (by_bearer or by_key) and found is None:
                found = i
        return found

    def _host_allowed(self, host: bytes) -> bool:
        name = host_name(host.decode("latin-1"))
        return name in self._allowed_hosts or is_loopback(name)


def host_name(host: str) -> str:
    """The name in a Host header, lower-cased, without its port or an IPv6 literal's brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(name: str) -> bool:
    """localhost and its subdomains (RFC 6761: they never leave the machine), 127.0.0.0/8 and ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def is_json(content_type: bytes | None) -> bool:
    """application/json or a +json type (application/vnd.api+json), parameters (charset) aside."""
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


async def _refuse(send: Send, path: str, status: int, message: str, headers: list | None = None) -> None:
    """An error before the body was read: the connection closes after it (see errors.error_response)."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"), *(headers or ())]})
    await send({"type": "http.response.body", "body": orjson.dumps(error_body_for(path, status, message))})
