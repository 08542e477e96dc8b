"""A stand-in for the Hugging Face hub on a loopback port, speaking the part of its API that
`huggingface_hub.snapshot_download` uses: repo info at a revision, the recursive file tree at a commit,
and HEAD/GET of `/{repo}/resolve/{commit}/{file}` with the X-Repo-Commit and ETag headers. Errors carry the
hub's X-Error-Code header (RepoNotFound, RevisionNotFound, GatedRepo) with its status codes: 401 for a gated
repo without a token, 403 with a token not granted, 404 for no such repo or revision. Every request is
recorded, so tests can tell a cache hit from a download.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    revisions: dict[str, str] = field(default_factory=dict)            # branch or tag -> commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> {path: content}
    gated_token: str | None = None                                      # set: only this token may read

    def add_commit(self, files: dict[str, bytes], *revisions: str) -> str:
        sha = hashlib.sha1(b"".join(k.encode() + v for k, v in sorted(files.items()))).hexdigest()
        self.commits[sha] = files
        for revision in revisions:
            self.revisions[revision] = sha
        return sha


def directory_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


class LoopbackHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def downloads(self) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    # ------------------------------------------------------------------ routing
    def _handle(self, request: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlparse(request.path).path)
        self.requests.append(("HEAD" if head else "GET", path))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
            repo, commit = self._resolve(request, m.group(1), m.group(2))
            if repo is not None:
                files = repo.commits[commit]
                self._json(request, {"id": m.group(1), "_id": m.group(1), "sha": commit, "private": False,
                                     "gated": "auto" if repo.gated_token else False,
                                     "siblings": [{"rfilename": name} for name in files]})
        elif m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path):
            repo, commit = self._resolve(request, m.group(1), m.group(2))
            if repo is not None:
                self._json(request, [{"type": "file", "path": name, "size": len(data),
                                      "oid": hashlib.sha1(data).hexdigest()}
                                     for name, data in repo.commits[commit].items()])
        elif m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            repo, commit = self._resolve(request, m.group(1), m.group(2))
            if repo is not None:
                data = repo.commits[commit].get(m.group(3))
                if data is None:
                    return self._error(request, 404, "EntryNotFound")
                request.send_response(200)
                request.send_header("Content-Length", str(len(data)))
                request.send_header("X-Repo-Commit", commit)
                request.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                request.end_headers()
                if not head:
                    request.wfile.write(data)
        else:
            self._error(request, 404, "EntryNotFound")

    def _resolve(self, request, repo_id: str, revision: str):
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(request, 404, "RepoNotFound"), None
        if repo.gated_token is not None:
            auth = request.headers.get("Authorization", "")
            if not auth:
                return self._error(request, 401, "GatedRepo"), None
            if auth != f"Bearer {repo.gated_token}":
                return self._error(request, 403, "GatedRepo"), None
        commit = revision if revision in repo.commits else repo.revisions.get(revision)
        if commit is None:
            return self._error(request, 404, "RevisionNotFound"), None
        return repo, commit

    @staticmethod
    def _json(request, body) -> None:
        data = json.dumps(body).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    @staticmethod
    def _error(request, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)
