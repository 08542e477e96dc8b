"""create_app: the starlette application over an engine client: each API package's handlers on their routes
(openai/ with the pooling routes, anthropic/, responses/, ollama/), the chat page (web/), the small routes,
the middleware.

Building the app starts nothing; the busy-log task runs in the app's lifespan, i.e. while a server runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.client.base import AsyncEngine
from engine.client.token_bounds import max_chars_per_token
from engine.client.tokenizer import load_tokenizer
from engine.outputs import EngineDeadError
from frontend import version
from frontend.anthropic.messages import AnthropicServingMessages
from frontend.chat.template import ChatTemplate
from frontend.config import ServerConfig
from frontend.errors import ApiError, error_response, from_engine_error
from frontend.http_responses import json_response
from frontend.metrics import CONTENT_TYPE, RequestEventLog, ServerMetrics, log_stats_periodically
from frontend.middleware import ServerMiddleware
from frontend.ollama.embed import OllamaEmbedding
from frontend.ollama.handlers import OllamaServing
from frontend.openai.chat import OpenAIServingChat
from frontend.openai.completions import OpenAIServingCompletion
from frontend.openai.embeddings import OpenAIServingEmbedding
from frontend.openai.logprobs import TokenStrings
from frontend.openai.models import OpenAIServingModels
from frontend.openai.score import OpenAIServingScores
from frontend.openai.tokenize import OpenAIServingTokenization
from frontend.openapi import openapi_document
from frontend.responses.handlers import OpenAIServingResponses
from frontend.serving_engine import ServingContext
from frontend.web.page import WebPage

logger = logging.getLogger("ringserve.server")
TOKENIZER_THREADS = 2       # long prompts tokenized at once (each holds memory in proportion to its length)


def create_app(engine_client: AsyncEngine, config: ServerConfig) -> Starlette:
    """The OpenAI-compatible app over a started engine client. `app.state.ctx` holds the shared state."""
    engine_config = engine_client.config
    tokenizer = load_tokenizer(engine_config)
    metrics = ServerMetrics(engine_client, engine_config.model_name)
    chars_per_token = max_chars_per_token(tokenizer)
    ctx = ServingContext(
        engine=engine_client, config=config, tokenizer=tokenizer, model_name=engine_config.model_name,
        max_model_len=engine_client.max_model_len, vocab_size=engine_config.vocab_size,
        max_logprobs=engine_config.max_logprobs, generation_defaults=engine_config.sampling_defaults.values,
        metrics=metrics, events=RequestEventLog(), token_strings=TokenStrings(tokenizer),
        chat_template=ChatTemplate.for_tokenizer(tokenizer, config.chat_template),
        chars_per_token=chars_per_token,
        max_prompt_chars=chars_per_token * engine_client.max_model_len if chars_per_token else None,
        local_paths=local_paths(engine_config),
        tokenizer_pool=ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="ringserve-tokenize"),
    )
    completions = OpenAIServingCompletion(ctx)
    chat = OpenAIServingChat(ctx)
    tokenization = OpenAIServingTokenization(ctx)
    messages = AnthropicServingMessages(ctx)
    responses = OpenAIServingResponses(ctx)
    models = OpenAIServingModels(ctx)
    ollama = OllamaServing(ctx)
    ollama_embedding = OllamaEmbedding(ollama)
    page = WebPage(config.web_ui)
    embeddings = OpenAIServingEmbedding(ctx)
    scores = OpenAIServingScores(ctx)
    handlers = _Handlers(ctx)
    routes = [
        Route("/v1/completions", completions.create_completion, methods=["POST"]),
        Route("/v1/chat/completions", chat.create_chat_completion, methods=["POST"]),
        Route("/v1/messages", messages.create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete_response, methods=["DELETE"]),
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/embeddings", embeddings.create_embedding, methods=["POST"]),
        Route("/v1/score", scores.create_score, methods=["POST"]),
        Route("/score", scores.create_score, methods=["POST"]),
        Route("/v1/rerank", scores.create_rerank, methods=["POST"]),
        Route("/rerank", scores.create_rerank, methods=["POST"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/version", handlers.version, methods=["GET"]),
        Route("/tokenize", tokenization.create_tokenize, methods=["POST"]),
        Route("/detokenize", tokenization.create_detokenize, methods=["POST"]),
        Route("/start_profile", handlers.start_profile, methods=["POST"]),
        Route("/stop_profile", handlers.stop_profile, methods=["POST"]),
        Route("/openapi.json", handlers.openapi, methods=["GET"]),
        Route("/api/chat", ollama.chat_route, methods=["POST"]),
        Route("/api/generate", ollama.generate_route, methods=["POST"]),
        Route("/api/embed", ollama_embedding.embed, methods=["POST"]),
        Route("/api/embeddings", ollama_embedding.embeddings, methods=["POST"]),
        Route("/api/tags", ollama.tags, methods=["GET"]),
        Route("/api/show", ollama.show, methods=["POST"]),
        Route("/api/ps", ollama.ps, methods=["GET"]),
        Route("/api/version", ollama.version, methods=["GET"]),
        Route("/api/pull", ollama.refuse, methods=["POST"]),
        Route("/api/push", ollama.refuse, methods=["POST"]),
        Route("/api/create", ollama.refuse, methods=["POST"]),
        Route("/api/copy", ollama.refuse, methods=["POST"]),
        Route("/api/delete", ollama.refuse, methods=["DELETE"]),
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
        if config.log_stats_interval > 0:
            task = asyncio.create_task(log_stats_periodically(metrics, config.log_stats_interval))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            ctx.events.stop()
            ctx.tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers={
        ApiError: _api_error, EngineDeadError: _engine_error, HTTPException: _http_error, Exception: _internal_error,
    })
    app.state.ctx = ctx
    app.state.web_page_path = page.path
    return app


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
    """The small routes: health, metrics, version, profiling, the OpenAPI document."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx
        self._openapi = orjson.dumps(openapi_document(version(), ctx.model_name, ctx.config.web_ui))

    async def health(self, request: Request) -> Response:
        engine = self.ctx.engine
        if engine.is_dead:
            return error_response(ApiError(503, f"the engine is not running: {engine.dead_error}"),
                                  path=request.url.path)
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return Response(self.ctx.metrics.render(), media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    async def version(self, request: Request) -> Response:
        return json_response({"version": version()})

    async def start_profile(self, request: Request) -> Response:
        ctx = self.ctx
        directory = ctx.config.profile_dir
        if not directory:
            raise ApiError(400, "profiling is disabled; start the server with --profile-dir DIR")
        if ctx.events.active:
            raise ApiError(400, "a profile is already running; POST /stop_profile first")
        engine_result = await ctx.engine.call("start_profile", dir=directory)
        events = ctx.events.start(directory)
        return json_response({"status": "started", "dir": directory, "engine": engine_result,
                              "request_events": events})

    async def stop_profile(self, request: Request) -> Response:
        ctx = self.ctx
        if not ctx.events.active:
            raise ApiError(400, "no profile is running; POST /start_profile first")
        events = ctx.events.stop()
        engine_result = await ctx.engine.call("stop_profile")
        return json_response({"status": "stopped", "dir": ctx.config.profile_dir, "engine": engine_result,
                              "request_events": events})


async def _api_error(request: Request, exc: ApiError) -> Response:
    return error_response(exc, path=request.url.path)


async def _engine_error(request: Request, exc: EngineDeadError) -> Response:
    return error_response(from_engine_error(exc, request.app.state.ctx.local_paths), path=request.url.path)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    # no route or method: the handler that would have read the body never ran
    return error_response(ApiError(exc.status_code, exc.detail), body_unread=True, path=request.url.path)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled error on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}"), path=request.url.path)
