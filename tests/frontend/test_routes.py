"""The small routes and the middleware: models, version, metrics, tokenize, detokenize, health, API key,
CORS, X-Request-Id, profiling."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest

from frontend.config import ServerConfig
from frontend.middleware import ServerMiddleware
from tests.frontend.harness import TINY_MAX_MODEL_LEN, serve_fake


def test_models(http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == "tiny" and card["object"] == "model" and card["max_model_len"] == TINY_MAX_MODEL_LEN


def test_version(http):
    assert re.fullmatch(r"\d+\.\d+\.\d+.*|0\+unknown", http.get("/version").json()["version"])


def test_tokenize_prompt_and_messages(http):
    body = http.post("/tokenize", json={"prompt": "hi!", "return_token_strs": True}).json()
    assert body == {"count": 3, "max_model_len": TINY_MAX_MODEL_LEN, "tokens": [104, 105, 33],
                    "token_strs": ["h", "i", "!"]}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    im_start = chat["tokens"][0]
    assert chat["count"] == len(chat["tokens"]) and chat["tokens"][1:6] == list(b"user\n")
    assert chat["tokens"].count(im_start) == 2          # the user turn and the generation prompt
    both = http.post("/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "x"}]})
    assert both.status_code == 400


def test_detokenize(http):
    assert http.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
    bad = http.post("/detokenize", json={"tokens": [1, 100000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def metric_value(text: str, name: str, **labels) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.index("}") + 1]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def test_metrics_count_tokens_and_requests(http):
    before = http.get("/metrics").text
    http.post("/v1/completions", json={"prompt": "abcd", "max_tokens": 5})
    http.post("/v1/completions", json={"prompt": "x", "max_tokens": 30, "temperature": 0, "stop": ["quick"]})
    after = http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text

    def grew(name, **labels):
        return metric_value(text, name, model_name="tiny", **labels) - metric_value(before, name, model_name="tiny", **labels)

    assert grew("ringserve:prompt_tokens_total") == 5
    assert grew("ringserve:generation_tokens_total") == 5 + len("The quick")
    assert grew("ringserve:request_success_total", finished_reason="length") == 1
    assert grew("ringserve:request_success_total", finished_reason="stop") == 1
    assert grew("ringserve:time_to_first_token_seconds_count") == 2
    assert grew("ringserve:e2e_request_latency_seconds_count") == 2
    assert grew("ringserve:inter_token_latency_seconds_count") == 4 + len("The quick") - 1
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
                 "prefix_cache_hits_total", "request_queue_time_seconds_count", "request_prefill_time_seconds_count",
                 "request_decode_time_seconds_count"):
        metric_value(text, "ringserve:" + name, model_name="tiny")
    # every ringserve sample carries the model_name label
    samples = [line for line in text.splitlines() if line.startswith("ringserve:")]
    assert samples and all('model_name="tiny"' in line for line in samples)


def test_request_id_is_echoed_or_generated(http):
    assert http.get("/health", headers={"x-request-id": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = http.get("/v1/models").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    response = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True},
                         headers={"x-request-id": "stream-1"})
    assert response.headers["x-request-id"] == "stream-1"


def test_profiling_is_off_without_a_profile_dir(http):
    response = http.post("/start_profile")
    assert response.status_code == 400 and "--profile-dir" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def guarded(tiny_model, tmp_path_factory):
    """A server with an API key, CORS for one origin, and profiling into a temporary directory."""
    profile_dir = tmp_path_factory.mktemp("profile")
    config = ServerConfig(log_stats_interval=0, api_key="s3cret", allowed_origins=["https://app.example"],
                          profile_dir=str(profile_dir))
    server, fake = serve_fake(tiny_model, server=config)
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        yield http, fake, profile_dir


AUTH = {"Authorization": "Bearer s3cret"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                                     {"Authorization": "Bearer s3cre"}, {"Authorization": "bearer s3cret"}])
def test_api_key_is_required(guarded, headers):
    http, _, _ = guarded
    for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics"),
                         ("POST", "/tokenize"), ("GET", "/version")):
        response = http.request(method, path, headers=headers, json={"prompt": "x"})
        assert response.status_code == 401, path
        assert response.json()["error"]["type"] == "AuthenticationError"


def test_api_key_accepted_and_health_open(guarded):
    http, _, _ = guarded
    assert http.get("/health").status_code == 200
    assert http.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 1}).status_code == 200


def test_api_key_compare_is_constant_time(monkeypatch):
    """The key check goes through hmac.compare_digest (timing-safe), never ==."""
    import frontend.middleware as middleware

    compared = []

    def spy(a, b):
        compared.append((a, b))
        return False

    monkeypatch.setattr(middleware.hmac, "compare_digest", spy)
    assert ServerMiddleware(app=None, api_keys=["k", "m"])._key_index(b"Bearer k", b"k") is None
    # every key is compared, in both headers, whatever matched before: the time says nothing about the keys
    assert compared == [(b"Bearer k", b"Bearer k"), (b"k", b"k"), (b"Bearer k", b"Bearer m"), (b"k", b"m")]


def test_cors(guarded):
    http, _, _ = guarded
    preflight = http.options("/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    simple = http.get("/v1/models", headers={**AUTH, "Origin": "https://app.example"})
    assert simple.headers["access-control-allow-origin"] == "https://app.example"
    other = http.get("/v1/models", headers={**AUTH, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_no_cors_headers_unless_configured(http):
    response = http.get("/v1/models", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in response.headers


def test_profiling_writes_request_events(guarded):
    http, fake, profile_dir = guarded
    started = http.post("/start_profile", headers=AUTH)
    assert started.status_code == 200
    assert http.post("/start_profile", headers=AUTH).status_code == 400
    http.post("/v1/completions", headers=AUTH, json={"prompt": "x", "max_tokens": 3})
    stopped = http.post("/stop_profile", headers=AUTH).json()
    assert [name for name, _ in fake.calls[-2:]] == ["start_profile", "stop_profile"]
    assert fake.calls[-2][1] == {"dir": str(profile_dir)}
    events = [json.loads(line) for line in open(stopped["request_events"])]
    kinds = [e["event"] for e in events]
    assert kinds == ["profile_start", "arrival", "finish", "profile_stop"]
    finish = events[2]
    assert finish["output_tokens"] == 3 and finish["finish_reason"] == "length"
    assert finish["arrival"] <= finish["first_token"] <= finish["last_token"]
    assert http.post("/stop_profile", headers=AUTH).status_code == 400


@pytest.mark.parametrize("enabled", [False, True])
def test_access_log_only_with_the_flag(tiny_model, caplog, enabled):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, enable_access_log=enabled))
    with caplog.at_level(logging.INFO), server, httpx.Client(base_url=server.url) as http:
        http.get("/v1/models")
    access = [r for r in caplog.records if r.name == "hypercorn.access"]
    assert bool(access) == enabled
    if enabled:
        assert "/v1/models" in access[-1].getMessage()
