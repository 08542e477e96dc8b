"""The frontend's defences, over the fake engine (fast; the same probes run against the real server in
tests/e2e/test_hostile_clients.py): Host names, JSON-only bodies, body deadlines, the request cap, several
API keys and their Responses stores, busy refusals, local paths in errors, and tokenization that leaves
the event loop free."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from engine.errors import EngineBusyError, busy_message, request_error
from frontend.config import ServerConfig
from frontend.errors import from_engine_error
from frontend.middleware import host_name, is_json, is_loopback
from tests.frontend.harness import serve_fake

KEYS = ["key-one", "key-two"]


@pytest.fixture(scope="module")
def hardened(tiny_model):
    config = ServerConfig(log_stats_interval=0, api_key=KEYS, allowed_hosts=["good.example"],
                          body_read_timeout=0.5, max_concurrent_requests=4)
    server, fake = serve_fake(tiny_model, server=config, step_delay=0.01)
    with server:
        yield server, fake


def client(server, key: str = KEYS[0]) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=10)


def test_host_names():
    assert [host_name(h) for h in ("LocalHost:8000", "[::1]:80", "127.0.0.1", "a.b:1")] == \
        ["localhost", "::1", "127.0.0.1", "a.b"]
    assert all(map(is_loopback, ("localhost", "app.localhost", "127.3.2.1", "::1")))
    assert not any(map(is_loopback, ("evil.example", "0.0.0.0", "localhost.evil.example", "10.0.0.1")))
    assert is_json(b"application/json; charset=utf-8") and is_json(b"Application/Problem+JSON")
    assert not any(map(is_json, (None, b"text/plain", b"text/json", b"application/jsonp")))


def test_foreign_hosts_are_refused_and_allowed_ones_pass(hardened):
    server, _ = hardened
    with client(server) as http:
        assert http.get("/v1/models", headers={"Host": "evil.example"}).status_code == 403
        assert http.get("/v1/models", headers={"Host": "good.example"}).status_code == 200
        assert http.get("/v1/models", headers={"Host": "localhost:1"}).status_code == 200


def test_a_server_on_all_interfaces_accepts_any_host_unless_told(tiny_model):
    server, _ = serve_fake(tiny_model, server=ServerConfig(log_stats_interval=0, host="0.0.0.0"))
    with server, httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.get("/v1/models", headers={"Host": "my-gpu-box.lan"}).status_code == 200


def test_bodies_must_be_json(hardened):
    server, _ = hardened
    body = b'{"prompt": "x", "max_tokens": 1}'
    with client(server) as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            r = http.post("/v1/completions", content=body, headers={"Content-Type": content_type})
            assert r.status_code == 415 and r.json()["error"]["type"] == "UnsupportedMediaTypeError"
        r = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200


def test_a_body_that_does_not_arrive_in_time_is_408(hardened):
    server, _ = hardened
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer key-one\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{")
        answer = b""
        while chunk := sock.recv(65536):    # the head and the body may come in separate segments
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408") and b"--body-read-timeout" in answer


def test_invalid_utf8_is_a_400(hardened):
    server, _ = hardened
    with client(server) as http:
        for path, body in (("/v1/completions", b'{"prompt": "\xff", "max_tokens": 1}'),
                           ("/tokenize", b'{"prompt": "a\xc3("}')):
            r = http.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]


def test_requests_past_the_cap_get_503_but_health_does_not(hardened):
    server, _ = hardened
    body = {"prompt": "x", "max_tokens": 200, "ignore_eos": True}
    done = []

    def slow() -> None:
        with client(server) as http:
            done.append(http.post("/v1/completions", json=body).status_code)

    threads = [threading.Thread(target=slow) for _ in range(4)]
    for t in threads:
        t.start()
    with client(server) as http:
        deadline = time.monotonic() + 5
        while (r := http.get("/v1/models")).status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert http.get("/health").status_code == 200
    for t in threads:
        t.join(30)
    assert done == [200] * 4


def test_each_key_has_its_own_responses_store(hardened):
    server, _ = hardened
    with client(server, KEYS[0]) as one, client(server, KEYS[1]) as two:
        rid = one.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2}).json()["id"]
        assert one.get(f"/v1/responses/{rid}").status_code == 200
        assert two.get(f"/v1/responses/{rid}").status_code == 404
        assert two.delete(f"/v1/responses/{rid}").status_code == 404
        assert one.delete(f"/v1/responses/{rid}").status_code == 200


def test_models_root_is_the_name_not_a_path(hardened):
    server, _ = hardened
    with client(server) as http:
        assert http.get("/v1/models").json()["data"][0]["root"] == "tiny"


def test_engine_errors_hide_local_paths_and_busy_refusals_say_when_to_retry():
    paths = {"/srv/models/m.gguf": "m", "/srv/models": "m"}
    error = from_engine_error(ValueError("cannot load '/srv/models/m.gguf' (see /srv/models/x)"), paths)
    assert error.status == 400 and error.message == "cannot load 'm' (see m/x)"
    busy = request_error(busy_message("too many grammars compiling", 10))
    assert isinstance(busy, EngineBusyError) and busy.retry_after == 10
    error = from_engine_error(busy)
    assert (error.status, error.message, dict(error.headers)[b"retry-after"]) == \
        (503, "too many grammars compiling", b"10")


def test_long_texts_are_tokenized_without_holding_the_event_loop():
    """The tokenizers library's encode holds the GIL for the whole text; encode_batch releases it. The
    server tokenizes long texts with the latter in a worker thread: meanwhile the main thread keeps running
    (its longest pause stays a small part of the tokenization), where under `encode` it stops outright."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {chr(c): c - 32 for c in range(32, 127)}
    tokenizer = Tokenizer(models.BPE(vocab, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    text = "lorem ipsum dolor sit amet " * 100_000

    def longest_pause(encode) -> tuple[float, float]:
        """(the main thread's longest stretch without running, the whole encode), from the worker's start."""
        finished = threading.Event()
        worker = threading.Thread(target=lambda: (encode(), finished.set()))
        started = last = time.monotonic()
        longest = 0.0
        worker.start()
        while not finished.is_set():
            sum(range(200))
            now = time.monotonic()
            longest, last = max(longest, now - last), now
        worker.join()
        end = time.monotonic()
        return max(longest, end - last), end - started

    pause, duration = longest_pause(lambda: tokenizer.encode_batch([text]))
    assert pause < duration / 4, (pause, duration)
    pause, duration = longest_pause(lambda: tokenizer.encode(text))
    assert pause > duration / 2, (pause, duration)          # the difference the server relies on
