"""create_app: the starlette application over the served models (a pool of engines, or one engine client):
each API package's handlers on their routes (openai/ with the pooling routes, anthropic/, responses/, ollama/),
built per model and reached through the models' one accessor (frontend/models/registry.py), the models'
lifecycle routes, the chat page (web/), the small routes, the middleware.

Building the app starts nothing; the busy-log task runs in the app's lifespan, i.e. while a server runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import msgspec
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.client.base import AsyncEngine
from engine.client.model_pool import ModelPool
from engine.client.token_bounds import max_chars_per_token
from engine.client.tokenizer import load_tokenizer
from engine.errors import EngineBusyError
from engine.outputs import EngineDeadError
from frontend import version
from frontend.anthropic.messages import AnthropicServingMessages
from frontend.chat.template import ChatTemplate
from frontend.config import ServerConfig
from frontend.errors import ApiError, error_response, from_engine_error
from frontend.http_responses import json_response
from frontend.metrics import CONTENT_TYPE, RequestEventLog, ServerMetrics, log_stats_periodically
from frontend.middleware import ServerMiddleware
from frontend.models.catalog import Catalog
from frontend.models.registry import Endpoint, ModelServing, ServedModels
from frontend.models.routes import ModelRoutes
from frontend.ollama.embed import OllamaEmbedding
from frontend.ollama.handlers import OllamaServing
from frontend.openai.chat import OpenAIServingChat
from frontend.openai.completions import OpenAIServingCompletion
from frontend.openai.embeddings import OpenAIServingEmbedding
from frontend.openai.logprobs import TokenStrings
from frontend.openai.score import OpenAIServingScores
from frontend.openai.tokenize import OpenAIServingTokenization
from frontend.openapi import openapi_document
from frontend.responses.handlers import OpenAIServingResponses
from frontend.serving_engine import ServingContext
from frontend.web.page import WebPage

logger = logging.getLogger("ringserve.server")
TOKENIZER_THREADS = 2       # long prompts tokenized at once (each holds memory in proportion to its length)


def create_app(engines: AsyncEngine | ModelPool, config: ServerConfig, catalog: Catalog | None = None) -> Starlette:
    """The OpenAI-compatible app over a started engine client, or over a pool of models (`catalog`: their
    configurations; default: the pool's configs under `config`). `app.state.models` holds the served models."""
    pool = engines if isinstance(engines, ModelPool) else ModelPool.of_client(engines)
    if catalog is None:
        catalog = Catalog(models={name: msgspec.structs.replace(config, engine=model.config)
                                  for name, model in pool.models.items()}, start_model=None)
    metrics = ServerMetrics(pool)
    events = RequestEventLog()
    tokenizer_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="ringserve-tokenize")
    stores: dict = {}            # the Responses API's stores, one per API key, shared by every model

    def build(engine: AsyncEngine, model_config: ServerConfig) -> ModelServing:
        ctx = serving_context(engine, model_config, metrics, events, tokenizer_pool, pool.names)
        completions, chat = OpenAIServingCompletion(ctx), OpenAIServingChat(ctx)
        tokenization, messages = OpenAIServingTokenization(ctx), AnthropicServingMessages(ctx)
        responses = OpenAIServingResponses(ctx, stores)
        ollama = OllamaServing(ctx)
        ollama_embedding = OllamaEmbedding(ollama)
        embeddings, scores = OpenAIServingEmbedding(ctx), OpenAIServingScores(ctx)
        return ModelServing(ctx, {
            "embeddings": embeddings.create_embedding, "score": scores.create_score, "rerank": scores.create_rerank,
            "completions": completions.create_completion, "chat": chat.create_chat_completion,
            "messages": messages.create_message, "count_tokens": messages.count_tokens,
            "responses": responses.create_response, "get_response": responses.get_response,
            "delete_response": responses.delete_response, "tokenize": tokenization.create_tokenize,
            "detokenize": tokenization.create_detokenize, "ollama_chat": ollama.chat_route,
            "ollama_generate": ollama.generate_route, "ollama_show": ollama.show, "ollama_tags": ollama.tags,
            "ollama_embed": ollama_embedding.embed, "ollama_embeddings": ollama_embedding.embeddings,
            "ollama_ps": ollama.ps, "ollama_version": ollama.version, "ollama_refuse": ollama.refuse,
        })

    models = ServedModels(pool, catalog.models, catalog.start_model, build=build, config=config)
    for name in pool.names:
        if pool.models[name].client is not None:
            models.build(name)           # a running model's tokenizer and template, before the ready line
    lifecycle = ModelRoutes(models)
    page = WebPage(config.web_ui)
    handlers = _Handlers(models, metrics, events, config)
    route = models.route
    routes = [
        Route("/v1/completions", route("completions"), methods=["POST"]),
        Route("/v1/chat/completions", route("chat"), methods=["POST"]),
        Route("/v1/messages", route("messages"), methods=["POST"]),
        Route("/v1/messages/count_tokens", route("count_tokens"), methods=["POST"]),
        Route("/v1/responses", route("responses"), methods=["POST"]),
        Route("/v1/responses/{response_id}", handlers.any_model("get_response"), methods=["GET"]),
        Route("/v1/responses/{response_id}", handlers.any_model("delete_response"), methods=["DELETE"]),
        Route("/v1/models", lifecycle.list_models, methods=["GET"]),
        Route("/v1/embeddings", route("embeddings"), methods=["POST"]),
        Route("/v1/score", route("score"), methods=["POST"]),
        Route("/score", route("score"), methods=["POST"]),
        Route("/v1/rerank", route("rerank"), methods=["POST"]),
        Route("/rerank", route("rerank"), methods=["POST"]),
        Route("/models/load", lifecycle.load, methods=["POST"]),
        Route("/models/unload", lifecycle.unload, methods=["POST"]),
        Route("/sleep", lifecycle.sleep, methods=["POST"]),
        Route("/wake_up", lifecycle.wake_up, methods=["POST"]),
        Route("/is_sleeping", lifecycle.is_sleeping, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route("/tokenize", route("tokenize"), methods=["POST"]),
        Route("/detokenize", route("detokenize"), methods=["POST"]),
        Route("/start_profile", handlers.start_profile, methods=["POST"]),
        Route("/stop_profile", handlers.stop_profile, methods=["POST"]),
        Route("/openapi.json", handlers.openapi, methods=["GET"]),
        Route("/api/chat", route("ollama_chat"), methods=["POST"]),
        Route("/api/generate", route("ollama_generate"), methods=["POST"]),
        Route("/api/embed", route("ollama_embed"), methods=["POST"]),
        Route("/api/embeddings", route("ollama_embeddings"), methods=["POST"]),
        Route("/api/tags", handlers.any_model("ollama_tags"), methods=["GET"]),
        Route("/api/show", route("ollama_show"), methods=["POST"]),
        Route("/api/ps", handlers.any_model("ollama_ps"), methods=["GET"]),
        Route("/api/version", handlers.any_model("ollama_version"), methods=["GET"]),
        Route("/api/pull", handlers.any_model("ollama_refuse"), methods=["POST"]),
        Route("/api/push", handlers.any_model("ollama_refuse"), methods=["POST"]),
        Route("/api/create", handlers.any_model("ollama_refuse"), methods=["POST"]),
        Route("/api/copy", handlers.any_model("ollama_refuse"), methods=["POST"]),
        Route("/api/delete", handlers.any_model("ollama_refuse"), methods=["DELETE"]),
        *page.routes(),
    ]
    middleware = []
    if config.allowed_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=config.allowed_origins, allow_methods=["*"],
                                     allow_headers=["*"], expose_headers=["x-request-id"]))
    middleware.append(Middleware(ServerMiddleware, api_keys=config.api_keys, max_header_bytes=config.max_header_bytes,
                                 listen_host=config.host, allowed_hosts=config.allowed_hosts,
                                 max_concurrent_requests=config.max_concurrent_requests,
                                 public_paths=page.public_paths))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        task = None
        pool.start()
        if config.log_stats_interval > 0:
            task = asyncio.create_task(log_stats_periodically(metrics, config.log_stats_interval))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            events.stop()
            tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers={
        ApiError: _api_error, EngineDeadError: _engine_error, EngineBusyError: _engine_error,
        HTTPException: _http_error, Exception: _internal_error,
    })
    app.state.models = models
    app.state.web_page_path = page.path
    return app


def serving_context(engine: AsyncEngine, config: ServerConfig, metrics: ServerMetrics, events: RequestEventLog,
                    tokenizer_pool: ThreadPoolExecutor, model_names: list[str]) -> ServingContext:
    """What one model's handlers share (blocking: it loads the tokenizer)."""
    engine_config = engine.config
    tokenizer = load_tokenizer(engine_config)
    chars_per_token = max_chars_per_token(tokenizer)
    return ServingContext(
        engine=engine, config=config, tokenizer=tokenizer, model_name=engine_config.model_name,
        max_model_len=engine.max_model_len, vocab_size=engine_config.vocab_size,
        max_logprobs=engine_config.max_logprobs, generation_defaults=engine_config.sampling_defaults.values,
        metrics=metrics.model(engine_config.model_name), events=events, token_strings=TokenStrings(tokenizer),
        chat_template=ChatTemplate.for_tokenizer(tokenizer, config.chat_template), chars_per_token=chars_per_token,
        max_prompt_chars=chars_per_token * engine.max_model_len if chars_per_token else None,
        local_paths=local_paths(engine_config), tokenizer_pool=tokenizer_pool, model_names=tuple(model_names),
    )


def local_paths(config) -> dict[str, str]:
    """The model's and tokenizer's files and directories on this machine, each mapped to what an error
    message may show instead: the served model's name."""
    name = config.model_name
    paths = {}
    for path in (config.model, config.tokenizer_path):
        if path and os.path.isabs(path):
            paths[path] = name
            parent = os.path.dirname(path)
            if os.path.isfile(path) and parent != "/":
                paths[parent] = name
    return paths


class _Handlers:
    """The server's own routes: health, metrics, version, profiling, the OpenAPI document, stored responses."""

    def __init__(self, models: ServedModels, metrics: ServerMetrics, events: RequestEventLog, config: ServerConfig):
        self.models, self.server_metrics, self.events, self.config = models, metrics, events, config
        self._openapi = orjson.dumps(openapi_document(version(), models.names, config.web_ui))

    async def health(self, request: Request) -> Response:
        for model in self.models.pool.running():
            if model.engine.is_dead:
                return error_response(ApiError(503, f"the engine of {model.name} is not running: "
                                                    f"{model.engine.dead_error}"), path=request.url.path)
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return Response(self.server_metrics.render(), media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    async def version(self, request: Request) -> Response:
        return json_response({"version": version()})

    def any_model(self, name: str) -> Endpoint:
        """A route that names no model (a stored response, Ollama's lists): any model's handler serves it, as
        what it reads is the server's (the response stores, the pool of models)."""
        async def endpoint(request: Request) -> Response:
            return await (await self.models.any_serving()).endpoints[name](request)

        return endpoint

    async def _engines(self, method: str, **args) -> str:
        """A control call on every running model's engine; the replies by model."""
        running = self.models.pool.running()
        if not running:
            return "no model is loaded"
        return "; ".join([f"{m.name}: {await m.engine.call(method, **args)}" for m in running])

    async def start_profile(self, request: Request) -> Response:
        directory = self.config.profile_dir
        if not directory:
            raise ApiError(400, "profiling is disabled; start the server with --profile-dir DIR")
        if self.events.active:
            raise ApiError(400, "a profile is already running; POST /stop_profile first")
        engine_result = await self._engines("start_profile", dir=directory)
        events = self.events.start(directory)
        return json_response({"status": "started", "dir": directory, "engine": engine_result,
                              "request_events": events})

    async def stop_profile(self, request: Request) -> Response:
        if not self.events.active:
            raise ApiError(400, "no profile is running; POST /start_profile first")
        events = self.events.stop()
        engine_result = await self._engines("stop_profile")
        return json_response({"status": "stopped", "dir": self.config.profile_dir, "engine": engine_result,
                              "request_events": events})


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc, path=request.url.path)


async def _engine_error(request: Request, exc: Exception) -> Response:
    paths = {path: name for serving in request.app.state.models.built() for path, name in serving.ctx.local_paths.items()}
    return error_response(from_engine_error(exc, paths), path=request.url.path)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    # no route or method: the handler that would have read the body never ran
    return error_response(ApiError(exc.status_code, exc.detail), body_unread=True, path=request.url.path)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}"), path=request.url.path)
