"""Fixtures for the frontend tests: the tiny model, and a shared server over a FakeEngine."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.frontend.harness import serve_fake, write_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def served(tiny_model):
    """(server, fake engine) shared by a module's tests; tests must leave the fake as they found it."""
    server, fake = serve_fake(tiny_model)
    with server:
        yield server, fake


@pytest.fixture
def http(served):
    server, _ = served
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
def client(served):
    server, _ = served
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
