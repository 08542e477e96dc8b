"""The chat page's serving: its files come with a Content-Security-Policy that keeps scripts, styles and
requests to this origin; they need no API key (the page asks for it) while the API behind them still does;
the Host guard (DNS rebinding) covers the page too; --no-web-ui leaves only a plain answer at `/`."""

from __future__ import annotations

import httpx
import pytest

from frontend.config import ServerConfig
from frontend.web.page import CONTENT_SECURITY_POLICY, FILES
from tests.frontend.harness import serve_fake

KEY = "page-key"


@pytest.fixture(scope="module")
def keyed(tiny_model):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, shutdown_timeout=1.0, api_key=KEY))
    with server:
        yield server


def test_the_page_and_its_files_carry_a_restrictive_csp(keyed):
    for path, (_, media) in FILES.items():
        response = httpx.get(keyed.url + path)
        assert response.status_code == 200 and response.headers["content-type"] == media
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    for rule in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
        assert rule in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    page = httpx.get(keyed.url + "/").text
    assert "<script>" not in page and "style=" not in page and "http" not in page.replace('name="viewport"', "")


def test_the_page_is_public_but_the_api_is_not(keyed):
    assert httpx.get(keyed.url + "/").status_code == 200
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    assert httpx.post(keyed.url + "/api/chat", json={}).status_code == 401
    ok = httpx.get(keyed.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    # the Host guard and the JSON-only rule hold for the page's origin as for any other
    assert httpx.get(keyed.url + "/", headers={"host": "rebound.example"}).status_code == 403
    form = httpx.post(keyed.url + "/v1/chat/completions", content=b"x=1", headers={
        "authorization": f"Bearer {KEY}", "content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415


def test_no_web_ui_leaves_a_plain_root(tiny_model):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, shutdown_timeout=1.0, web_ui=False))
    with server:
        assert server.app.state.web_page_path is None
        root = httpx.get(server.url + "/")
        assert root.status_code == 200 and root.text == "ringserve is running\n"     # Ollama's CLI probes it
        assert httpx.head(server.url + "/").status_code == 200
        assert httpx.get(server.url + "/web/app.js").status_code == 404
        paths = httpx.get(server.url + "/openapi.json").json()["paths"]
        assert "/web/app.js" not in paths and paths["/"]["get"]["summary"] == "Says that the server runs"
