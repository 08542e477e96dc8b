"""ServedModels: the models a server serves, as its routes reach them.

`serving(model)` is the one way a handler finds its engine: by the request's `model` (a missing one means
the server's default model), it returns that model's serving state — its ServingContext (tokenizer, chat
template, limits, metrics, and its engine: the pool's PooledEngine, which loads or wakes the model when a
request runs) and its handlers, built by the app on first use. An unknown name is a 404 that names it and
lists the models there are. `route(name)` makes a route's endpoint: it reads the body once (the handler
decodes the same bytes), finds the `model` in it, and calls that model's handler.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from engine.client.model_pool import ModelPool, UnknownModelError
from engine.client.pooled_engine import PooledEngine
from frontend.config import ServerConfig
from frontend.errors import ApiError
from frontend.serving_engine import ServingContext, request_body

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(slots=True)
class ModelServing:
    """One model's serving state: its context and its handlers' endpoints by route name."""

    ctx: ServingContext
    endpoints: dict[str, Endpoint]


class _ModelField(msgspec.Struct):
    model: str | None = None
    name: str | None = None           # Ollama's /api/show names the model so too


class ServedModels:
    def __init__(self, pool: ModelPool, configs: dict[str, ServerConfig], default: str | None, *,
                 build: Callable[[PooledEngine, ServerConfig], ModelServing], config: ServerConfig) -> None:
        self.pool = pool
        self.configs = configs
        self.default = default if default is not None or len(configs) > 1 else next(iter(configs))
        self.config = config
        self._build = build
        self._serving: dict[str, ModelServing] = {}
        self._building: dict[str, asyncio.Future] = {}
        self._build_lock = threading.Lock()
        # a model's tokenizer and template go with its engine (memory back after an unload); the next load
        # builds them again while its engine starts
        pool.on_unload.append(lambda name: self._serving.pop(name, None))

    @property
    def names(self) -> list[str]:
        return self.pool.names

    def name_for(self, model: str | None) -> str:
        """The served model a request's `model` field names (None: the default model)."""
        if model is None:
            if self.default is None:
                raise ApiError(400, f"`model` is required: this server serves {', '.join(self.names)}", "model")
            return self.default
        if model not in self.pool.models:
            raise ApiError(404, str(UnknownModelError(model, self.names)), "model")
        return model

    async def serving(self, model: str | None, *, prefetch: bool = False) -> ModelServing:
        """The serving state of the model the request names: THE accessor of every route that serves a model.
        `prefetch`: a request that will run on the engine; its engine starts loading now if there is room,
        so that a cold model's tokenizer loads while its engine starts."""
        name = self.name_for(model)
        if prefetch:
            self.pool.prefetch(name)
        serving = self._serving.get(name)
        if serving is not None:
            return serving
        building = self._building.get(name)
        if building is None:
            building = self._building[name] = asyncio.ensure_future(asyncio.to_thread(self.build, name))
            building.add_done_callback(lambda _: self._building.pop(name, None))
        return await asyncio.shield(building)

    def build(self, name: str) -> ModelServing:
        """Build (once) the model's serving state: tokenizer, chat template, handlers (blocking)."""
        with self._build_lock:          # one at a time: transformers' lazy imports race across threads
            serving = self._serving.get(name)
            if serving is None:
                serving = self._serving[name] = self._build(self.pool.model(name).engine, self.configs[name])
        return serving

    def built(self) -> list[ModelServing]:
        return list(self._serving.values())

    async def for_request(self, request: Request) -> ModelServing:
        """The serving state of the model named by the request body's `model`."""
        body = await request_body(request, self.config)
        try:
            named = msgspec.json.decode(body, type=_ModelField)
            model = named.model if named.model is not None else named.name
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            model = ""
        if model and model.endswith(":latest") and model[:-len(":latest")] in self.pool.models:
            model = model[:-len(":latest")]          # Ollama clients name a model with its tag
        if model is not None and model not in self.pool.models:
            # a body that does not parse, or names no model of ours: any model's handler decodes it and says
            # what is wrong with it first (400), then that the model does not exist (404), as for one model
            return await self.any_serving()
        return await self.serving(model, prefetch=True)

    async def any_serving(self) -> ModelServing:
        """A model's serving state, for what is the same for every model (errors, the stored responses)."""
        built = self.built()
        return built[0] if built else await self.serving(self.default or self.names[0])

    def route(self, name: str) -> Endpoint:
        """The endpoint of route `name`: the handler of the model the request names."""
        async def endpoint(request: Request) -> Response:
            serving = await self.for_request(request)
            return await serving.endpoints[name](request)

        endpoint.__name__ = name
        return endpoint
