"""Fixtures of the benchmark tools' tests: real tokenizers from ../shared, each loaded once."""

from __future__ import annotations

import functools

import pytest

from tests.conftest import shared_path


@functools.cache
def _load(name: str):
    from engine.client.tokenizer import load_tokenizer
    from engine.config import EngineConfig

    return load_tokenizer(EngineConfig(tokenizer=str(shared_path("models", "tokenizers", name))))


@pytest.fixture(scope="session")
def shared_tokenizer():
    """shared_tokenizer("qwen3") -> the real Qwen3 tokenizer (skips when ../shared is absent)."""
    return _load
