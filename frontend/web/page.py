"""Serving the chat page: its files read once, each answered with headers that keep it to itself.

The Content-Security-Policy allows scripts, styles and requests from this origin alone, no inline script or
style, no plugins, no framing (clickjacking) and no form posts; `nosniff` keeps a browser from reading a
file as another type. The page's files are public (the page asks for the API key itself, and sends it as
a Bearer token); the API behind them keeps every check of frontend/middleware.py (Host names, API key,
JSON bodies only). With --no-web-ui, `/` says only that the server runs (Ollama's CLI probes it).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

STATIC = Path(__file__).resolve().parent / "static"
PAGE_PATH = "/"
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/web/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/web/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
         "/web/style.css": ("style.css", "text/css; charset=utf-8")}
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CONTENT_SECURITY_POLICY, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "x-frame-options": "DENY", "cache-control": "no-cache"}
RUNNING = b"ringserve is running\n"


class WebPage:
    """The page's routes (or, without it, the plain answer at `/`) and the paths that need no API key."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.path = PAGE_PATH if enabled else None
        self._files = {path: ((STATIC / name).read_bytes(), media) for path, (name, media) in FILES.items()} \
            if enabled else {}
        self.public_paths = frozenset(FILES if enabled else ("/",))

    def routes(self) -> list[Route]:
        if not self.enabled:
            return [Route("/", self._running, methods=["GET"])]
        return [Route(path, self._file, methods=["GET"]) for path in self._files]

    async def _file(self, request: Request) -> Response:
        content, media = self._files[request.url.path]
        return Response(content, media_type=media, headers=HEADERS)

    async def _running(self, request: Request) -> Response:
        return Response(RUNNING, media_type="text/plain; charset=utf-8")
