"""The typed engine face (engine/client/base.py AsyncEngine): the clients the server runs over (one engine,
data-parallel engines) and the tests' FakeEngine all have it, with the same call signatures, so the fake
tests the frontend against what the real clients offer."""

from __future__ import annotations

import inspect

import msgspec
import pytest

from engine.client.base import AsyncEngine
from engine.client.dp_client import DPEngineClient
from engine.client.engine_client import EngineClient
from tests.frontend.fake_engine import FakeEngine
from tests.frontend.harness import engine_config

METHODS = ("start", "generate", "call", "fail_unfinished", "shutdown")


@pytest.fixture(scope="module")
def engines(tiny_model):
    config = engine_config(tiny_model)
    return [FakeEngine(config), EngineClient(config),        # built, never started: no process runs
            DPEngineClient(msgspec.structs.replace(config, data_parallel_size=2))]


def test_every_engine_has_the_face(engines):
    for engine in engines:
        assert isinstance(engine, AsyncEngine), type(engine).__name__
        assert engine.max_model_len > 0 and not engine.is_dead and engine.num_unfinished == 0


@pytest.mark.parametrize("name", METHODS)
def test_their_methods_take_what_the_face_says(engines, name):
    expected = inspect.signature(getattr(AsyncEngine, name))
    for engine in engines:
        method = getattr(type(engine), name)
        got = inspect.signature(method)
        assert [(p.name, p.kind) for p in got.parameters.values()] == \
            [(p.name, p.kind) for p in expected.parameters.values()], f"{type(engine).__name__}.{name}{got}"
        if name == "generate":          # an async iterator of deltas
            assert inspect.isasyncgenfunction(method), type(engine).__name__
        else:
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(getattr(AsyncEngine, name)), \
                f"{type(engine).__name__}.{name}: async or not as the face says"


def test_a_missing_member_is_seen():
    class Partial:
        config = max_model_len = num_blocks = None
        is_dead = dead_error = stats = num_unfinished = None

        def start(self): ...

        async def call(self, method: str, **args) -> str: ...

    assert not isinstance(Partial(), AsyncEngine)          # no generate, fail_unfinished, shutdown
