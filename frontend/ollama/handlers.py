"""Ollama's routes: /api/chat and /api/generate through the one chat preparation and the one runner (written
by frontend/ollama/wire.py), /api/tags, /api/show, /api/ps and /api/version from the model's card, and the
model-management routes (pull, push, create, copy, delete) answered with an error that says why.

A chat with no messages, or a generate with no prompt, loads the model in Ollama; here the request's route
has already started loading it (frontend/models/registry.py), so the answer says so at once (done_reason
"load"; "unload" when keep_alive 0 unloads it, on a server with several models: frontend/ollama/keep_alive.py).
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from engine.sampling_params import SamplingParams
from frontend.chat.preparation import ChatPreparation
from frontend.chat.structured_outputs import structured_outputs
from frontend.errors import ApiError, invalid
from frontend.http_responses import json_response
from frontend.ollama.keep_alive import ModelResidency, parse_keep_alive
from frontend.ollama.models import OLLAMA_API_VERSION, ModelCard
from frontend.ollama.options import Options, output_budget, read_options
from frontend.ollama.protocol import (
    OllamaChatRequest,
    OllamaCopyRequest,
    OllamaGenerateRequest,
    OllamaModelRequest,
    OllamaSampledRequest,
    OllamaShowRequest,
)
from frontend.ollama.translate import FIELD_NAMES, chat_request, generate_request, sampling_request
from frontend.ollama.wire import OllamaWire, created_at
from frontend.serving_engine import OpenAIServing, ServingContext

NO_DOWNLOADS = ("ringserve serves the model it was started with and does not {what} models; start "
                "`ringserve serve MODEL` with the model you want (a directory, a .gguf file or a hub id)")


class OllamaServing(OpenAIServing):
    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.chat = ChatPreparation(self)
        self.card = ModelCard(ctx, sum((getattr(ctx.engine, "weight_bytes", None) or {}).values()))
        self.residency = ModelResidency(ctx.engine)

    def check_model(self, model: str | None) -> None:
        if model is None:
            return
        if not model:
            raise invalid("model is required", "model")
        if not self.card.matches(model):
            served = ", ".join(f"'{name}'" for name in self.residency.names())
            raise ApiError(404, f"model '{model}' not found; this server serves {served}", "model")

    # ------------------------------------------------------------------ generation
    async def chat_route(self, request: Request) -> Response:
        arrival = time.monotonic()
        req = await self.read(request, OllamaChatRequest)
        options, unloaded = self._admit(req)
        if not req.messages:
            return self._load_answer(req, chat=True, unloaded=unloaded)
        prepared = await self.chat.prepare(chat_request(req, options), names=FIELD_NAMES, prompt_param="messages")
        params = self._within_context(prepared.params, len(prepared.prompt), options, "messages")
        run = self.run(request, self.new_id("ollama-chat"), [prepared.prompt], [params], 1, arrival,
                       keep_output=False, parsers=prepared.parsers(1), structured=prepared.structured)
        return run.respond(OllamaWire(run, req.model, chat=True), req.stream)

    async def generate_route(self, request: Request) -> Response:
        arrival = time.monotonic()
        req = await self.read(request, OllamaGenerateRequest)
        options, unloaded = self._admit(req)
        for name in ("suffix", "template"):
            if getattr(req, name):
                raise invalid(f"{name} is not supported: " + ("fill-in-the-middle is not served" if name == "suffix"
                              else "the model's own chat template is used (or none, with raw)"), name)
        if not req.prompt:
            return self._load_answer(req, chat=False, unloaded=unloaded)
        if req.raw:
            prompt, params, structured = await self._raw(req, options)
            parsers = None
        else:
            prepared = await self.chat.prepare(generate_request(req, options), names=FIELD_NAMES,
                                               prompt_param="prompt")
            prompt, params, structured = prepared.prompt, prepared.params, prepared.structured
            parsers = prepared.parsers(1)
        if req.context:
            self.check_token_ids(req.context, "context")
            prompt = req.context + prompt
        params = self._within_context(params, len(prompt), options, "prompt")
        run = self.run(request, self.new_id("ollama-generate"), [prompt], [params], 1, arrival,
                       keep_output=False, parsers=parsers, structured=structured)
        wire = OllamaWire(run, req.model, chat=False, context=None if req.raw else list(prompt))
        return run.respond(wire, req.stream)

    def _admit(self, req: OllamaSampledRequest) -> tuple[Options, bool]:
        """Checks every generation request passes first; the options, and whether keep_alive unloaded."""
        self.check_engine()
        options = read_options(req.options)
        if req.think not in (None, False) and not self.ctx.config.reasoning_parser:
            raise invalid("think needs a reasoning model: start the server with --reasoning-parser "
                          "(qwen3, deepseek_r1)", "think")
        if req.logprobs:
            raise invalid("logprobs are not served on Ollama's routes; use /v1/chat/completions", "logprobs")
        if self.card.pooling:
            raise invalid(f"'{self.card.name}' is an embedding model: use /api/embed", "model")
        return options, self.residency.keep_alive(req.model, parse_keep_alive(req.keep_alive))

    async def _raw(self, req: OllamaGenerateRequest, options: Options) -> tuple[list[int], SamplingParams, str | None]:
        """A raw generate: the prompt's own tokens, no template; sampling and format as in chat."""
        chat = sampling_request(req, options)
        try:
            constraint, field = await structured_outputs(chat)
        except ApiError as e:
            raise invalid(e.message, "format") from None
        prompt = (await self.tokenize_prompts([req.prompt], True, "prompt"))[0]
        params = self.sampling_params(chat, logprobs=None, prompt_logprobs=None, names=FIELD_NAMES,
                                      structured_outputs=constraint)
        params = self.prompt_params(params, len(prompt), None, "options.num_predict", "prompt")
        return prompt, params, "format" if field else None

    def _within_context(self, params: SamplingParams, prompt_len: int, options: Options,
                        prompt_param: str) -> SamplingParams:
        budget = output_budget(options, prompt_len, self.ctx.max_model_len, params.max_tokens, prompt_param)
        return msgspec.structs.replace(params, max_tokens=budget)

    def _load_answer(self, req: OllamaSampledRequest, *, chat: bool, unloaded: bool) -> Response:
        text = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
        return json_response({"model": req.model, "created_at": created_at(), **text, "done": True,
                              "done_reason": "unload" if unloaded else "load"})

    # ------------------------------------------------------------------ the model
    async def tags(self, request: Request) -> Response:
        return json_response({"models": [card.listed() for card in self._cards()]})

    async def ps(self, request: Request) -> Response:
        running = set(self.residency.running())
        return json_response({"models": [card.running(self.residency.expires_at(card.name))
                                         for card in self._cards() if card.name in running]})

    def _cards(self) -> list[ModelCard]:
        """Every served model's card (this one's in full)."""
        configs = self.residency.configs()
        if not configs:
            return [self.card]
        return [self.card if name == self.card.name else ModelCard.listing(config, name) for name, config in configs]

    async def version(self, request: Request) -> Response:
        return json_response({"version": OLLAMA_API_VERSION})

    async def show(self, request: Request) -> Response:
        req = await self.read(request, OllamaShowRequest)
        self.check_model(req.model if req.model is not None else req.name or "")
        return json_response(self.card.shown())

    # ------------------------------------------------------------------ what this server does not do
    async def refuse(self, request: Request) -> Response:
        """/api/pull, push, create, copy, delete: the body is read and checked, then a 400 that says why."""
        kind, message = REFUSALS[request.url.path]
        await self.read(request, kind)
        raise ApiError(400, message.format(name=self.card.name))


REFUSALS = {
    "/api/pull": (OllamaModelRequest, NO_DOWNLOADS.format(what="download")),
    "/api/push": (OllamaModelRequest, NO_DOWNLOADS.format(what="upload")),
    "/api/create": (OllamaModelRequest, NO_DOWNLOADS.format(what="create")),
    "/api/copy": (OllamaCopyRequest, NO_DOWNLOADS.format(what="copy")),
    "/api/delete": (OllamaModelRequest, "ringserve does not delete models: stop the server to stop serving "
                                        "'{name}'; its files stay where they are"),
}
