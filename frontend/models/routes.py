"""The routes of the models' lifecycle.

- GET /v1/models: every model the server serves, with its state (loaded, loading, unloaded, sleeping,
  unloading) in llama-server's `status.value`, and its loading progress while it loads.
- POST /models/load and POST /models/unload with {"model": NAME}: llama-server's router routes. A load
  makes room as a request would (--models-max); an unload waits for the model's requests in flight.
- vLLM's sleep API: POST /sleep?level=1|2, POST /wake_up, GET /is_sleeping, each for `?model=NAME`, or
  without it for the server's default model (with none, for every running model).
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from engine.client.model_pool import LOADING, SLEEPING, PooledModel
from frontend.errors import ApiError, from_validation_error
from frontend.http_responses import json_response
from frontend.models.registry import ServedModels
from frontend.serving_engine import request_body


class ModelRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The body of POST /models/load and /models/unload."""

    model: str


class ModelRoutes:
    def __init__(self, models: ServedModels):
        self.models = models
        self.pool = models.pool
        self.created = int(time.time())

    def card(self, model: PooledModel) -> dict:
        """One model as GET /v1/models lists it (its name, never where its files live)."""
        status: dict = {"value": model.state}
        if model.state == LOADING:
            status["progress"] = round(model.progress, 3)
        if model.state == SLEEPING:
            status["sleep_level"] = model.sleep_level
        expires = self.pool.expires_at(model)
        if expires is not None and model.client is not None:
            status["unload_in_s"] = round(max(expires - time.monotonic(), 0.0), 1)
        return {"id": model.name, "object": "model", "created": self.created, "owned_by": "ringserve",
                "root": model.name, "parent": None, "max_model_len": model.config.max_model_len, "status": status}

    async def list_models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [self.card(m) for m in self.pool.models.values()]})

    async def load(self, request: Request) -> Response:
        model = await self.pool.load(await self._named(request))
        return json_response({"success": True, **self.card(model)})

    async def unload(self, request: Request) -> Response:
        model = await self.pool.unload(await self._named(request))
        return json_response({"success": True, **self.card(model)})

    async def sleep(self, request: Request) -> Response:
        value = request.query_params.get("level", "1")
        if value not in ("1", "2"):
            raise ApiError(400, f"level must be 1 (free the KV cache) or 2 (and the weights), got {value!r}", "level")
        for name in self._chosen(request):
            await self.pool.sleep(name, int(value))
        return Response(status_code=200)

    async def wake_up(self, request: Request) -> Response:
        for name in self._chosen(request):
            await self.pool.wake_up(name)
        return Response(status_code=200)

    async def is_sleeping(self, request: Request) -> Response:
        chosen = self._chosen(request)
        asleep = {name: self.pool.model(name).state == SLEEPING for name in chosen}
        body = {"is_sleeping": bool(asleep) and all(asleep.values())}
        if len(self.pool.models) > 1:
            body["models"] = asleep
        return json_response(body)

    async def _named(self, request: Request) -> str:
        data = await request_body(request, self.models.config)
        try:
            name = msgspec.json.decode(data, type=ModelRequest).model
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise from_validation_error(e) from None
        return self.models.name_for(name)

    def _chosen(self, request: Request) -> list[str]:
        """The models a sleep-API call is for: ?model=NAME, else the default model, else every running one."""
        name = request.query_params.get("model")
        if name is not None or self.models.default is not None:
            return [self.models.name_for(name)]
        return [m.name for m in self.pool.running()]
