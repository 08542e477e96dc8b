"""GET /openapi.json: an OpenAPI 3.1 document of every route, generated from the msgspec request types.

Request bodies are the Structs the handlers decode with (msgspec.json.schema_components), so the document
cannot drift from what the server accepts. Response bodies are described by the small hand-written schemas
below: the keys clients rely on, each object open to more. Errors are in OpenAI's shape, in Anthropic's
under /v1/messages and in Ollama's under /api/. A test fuzzes the server with schemathesis against this
document.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from frontend.chat.protocol import ChatCompletionRequest
from frontend.models.routes import ModelRequest
from frontend.ollama.protocol import (
    OllamaChatRequest,
    OllamaCopyRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaModelRequest,
    OllamaShowRequest,
)
from frontend.openai.protocol import (
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
    TokenizeRequest,
)
from frontend.responses.protocol import ResponsesRequest

REF = "#/components/schemas/{name}"


def _obj(required: dict[str, dict], **optional: dict) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


STR, INT, BOOL, NUM = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"}
OBJ, ARR = {"type": "object"}, {"type": "array"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


USAGE = _obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})
RESPONSE_SCHEMAS = {
    "OpenAIError": _obj({"error": _obj({"message": STR, "type": STR, "code": INT}, param=_nullable(STR))}),
    "AnthropicError": _obj({"type": {"const": "error"}, "error": _obj({"type": STR, "message": STR})}),
    "Completion": _obj({"id": STR, "object": {"const": "text_completion"}, "created": INT, "model": STR,
                        "choices": {"type": "array", "items": _obj({"index": INT, "text": STR,
                                                                    "finish_reason": _nullable(STR)})},
                        "usage": USAGE}),
    "ChatCompletion": _obj({"id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
                            "choices": {"type": "array", "items": _obj({
                                "index": INT, "finish_reason": _nullable(STR),
                                "message": _obj({"role": STR}, content=_nullable(STR))})},
                            "usage": USAGE}),
    "AnthropicMessage": _obj({"id": STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": STR,
                     "content": {"type": "array", "items": _obj({"type": {"enum": ["text", "thinking", "tool_use"]}})},
                     "stop_reason": _nullable({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}),
                     "stop_sequence": _nullable(STR),
                     "usage": _obj({"input_tokens": INT, "output_tokens": INT})}),
    "TokenCount": _obj({"input_tokens": INT}),
    "ResponseObject": _obj({"id": STR, "object": {"const": "response"}, "created_at": INT, "model": STR,
                      "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]},
                      "output": {"type": "array", "items": _obj({
                          "type": {"enum": ["message", "reasoning", "function_call"]}, "id": STR})},
                      "usage": _nullable(_obj({"input_tokens": INT, "output_tokens": INT, "total_tokens": INT}))}),
    "ResponseDeleted": _obj({"id": STR, "object": STR, "deleted": BOOL}),
    "EmbeddingList": _obj({"object": {"const": "list"}, "model": STR,
                           "data": {"type": "array", "items": _obj({
                               "index": INT, "object": {"const": "embedding"},
                               "embedding": {"anyOf": [{"type": "array", "items": NUM}, STR]}})},
                           "usage": _obj({"prompt_tokens": INT, "total_tokens": INT})}),
    "ScoreList": _obj({"object": {"const": "list"}, "model": STR,
                       "data": {"type": "array", "items": _obj({"index": INT, "object": {"const": "score"},
                                                                "score": NUM})},
                       "usage": _obj({"prompt_tokens": INT, "total_tokens": INT})}),
    "RerankResults": _obj({"model": STR, "results": {"type": "array", "items": _obj(
                               {"index": INT, "relevance_score": NUM}, document=_obj({"text": STR}))},
                           "usage": _obj({"total_tokens": INT})}),
    "ModelList": _obj({"object": {"const": "list"}, "data": {"type": "array", "items": _obj({"id": STR})}}),
    "Tokenized": _obj({"count": INT, "max_model_len": INT, "tokens": {"type": "array", "items": INT}}),
    "Detokenized": _obj({"prompt": STR}),
    "Version": _obj({"version": STR}),
    "Sleeping": _obj({"is_sleeping": BOOL}),
    "Object": OBJ,
    "OllamaError": _obj({"error": STR}),
    "OllamaChat": _obj({"model": STR, "created_at": STR, "done": BOOL,
                        "message": _obj({"role": STR, "content": STR})}, done_reason=STR, total_duration=INT,
                       eval_count=INT),
    "OllamaGenerate": _obj({"model": STR, "created_at": STR, "done": BOOL, "response": STR}, done_reason=STR,
                           context={"type": "array", "items": INT}, total_duration=INT, eval_count=INT),
    "OllamaEmbed": _obj({"model": STR, "embeddings": {"type": "array", "items": {"type": "array", "items": NUM}}},
                        total_duration=INT, load_duration=INT, prompt_eval_count=INT),
    "OllamaEmbeddings": _obj({"embedding": {"type": "array", "items": NUM}}),
    "OllamaTags": _obj({"models": {"type": "array", "items": _obj({"name": STR, "model": STR, "details": OBJ})}}),
    "OllamaShow": _obj({"details": OBJ, "model_info": OBJ, "capabilities": {"type": "array", "items": STR}},
                       template=STR, modelfile=STR, parameters=STR),
    "OllamaPs": _obj({"models": {"type": "array", "items": _obj({"name": STR, "model": STR, "expires_at": STR,
                                                                "context_length": INT})}}),
    # One server-sent event (schemathesis checks each event of a stream against it).
    "OpenAIEvent": _obj({"data": STR}, event=STR),
    "AnthropicEvent": _obj({"data": STR, "event": {"enum": [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop", "ping", "error"]}}),
    "ResponsesEvent": _obj({"data": STR, "event": {"type": "string", "pattern": "^(response\\.[a-z_.]+|error)$"}}),
}
EVENT_SCHEMAS = {"/v1/messages": "AnthropicEvent", "/v1/responses": "ResponsesEvent"}
SLEEP_PATHS = ("/sleep", "/wake_up", "/is_sleeping")
NDJSON = "application/x-ndjson"          # Ollama's streams: one JSON object a line


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    request: type | None = None          # the msgspec type the handler decodes the body as
    response: str | None = None          # a RESPONSE_SCHEMAS name; None: no JSON body
    streams: bool = False                # "stream": true answers with server-sent events
    media_type: str = "application/json"
    public: bool = False                 # reachable without the API key (the page's files)


OPERATIONS = [
    Operation("POST", "/v1/completions", "Text completions (OpenAI)", CompletionRequest, "Completion", True),
    Operation("POST", "/v1/chat/completions", "Chat completions (OpenAI)", ChatCompletionRequest,
              "ChatCompletion", True),
    Operation("POST", "/v1/messages", "Messages (Anthropic)", MessagesRequest, "AnthropicMessage", True),
    Operation("POST", "/v1/messages/count_tokens", "Count a Messages prompt's tokens (Anthropic)",
              CountTokensRequest, "TokenCount"),
    Operation("POST", "/v1/responses", "Responses (OpenAI)", ResponsesRequest, "ResponseObject", True),
    Operation("GET", "/v1/responses/{response_id}", "A stored response", None, "ResponseObject"),
    Operation("DELETE", "/v1/responses/{response_id}", "Delete a stored response", None, "ResponseDeleted"),
    Operation("GET", "/v1/models", "The served models and their states", None, "ModelList"),
    Operation("POST", "/models/load", "Load a model (llama-server's router)", ModelRequest, "Object"),
    Operation("POST", "/models/unload", "Unload a model once its requests have finished", ModelRequest, "Object"),
    Operation("POST", "/sleep", "Free a model's KV cache (level=1) or its weights too (level=2); ?model=NAME"),
    Operation("POST", "/wake_up", "Wake a sleeping model; ?model=NAME"),
    Operation("GET", "/is_sleeping", "Whether a model sleeps; ?model=NAME", None, "Sleeping"),
    Operation("POST", "/v1/embeddings", "Embeddings (OpenAI; a pooling model)", EmbeddingRequest, "EmbeddingList"),
    Operation("POST", "/v1/score", "Scores of text pairs (vLLM; a pooling model)", ScoreRequest, "ScoreList"),
    Operation("POST", "/score", "Scores of text pairs (vLLM; a pooling model)", ScoreRequest, "ScoreList"),
    Operation("POST", "/v1/rerank", "Documents by relevance to a query (vLLM, Jina, Cohere; a pooling model)",
              RerankRequest, "RerankResults"),
    Operation("POST", "/rerank", "Documents by relevance to a query (vLLM, Jina, Cohere; a pooling model)",
              RerankRequest, "RerankResults"),
    Operation("GET", "/health", "200 while the engine runs, 503 when it is dead"),
    Operation("GET", "/metrics", "Prometheus metrics", media_type="text/plain"),
    Operation("GET", "/version", "The server's version", None, "Version"),
    Operation("POST", "/tokenize", "Tokenize a prompt or chat messages (vLLM)", TokenizeRequest, "Tokenized"),
    Operation("POST", "/detokenize", "Token ids to text (vLLM)", DetokenizeRequest, "Detokenized"),
    Operation("POST", "/start_profile", "Start a profile (with --profile-dir)", None, "Object"),
    Operation("POST", "/stop_profile", "Stop the profile", None, "Object"),
    Operation("GET", "/openapi.json", "This document", None, "Object"),
    Operation("POST", "/api/chat", "Chat (Ollama); streams NDJSON unless \"stream\": false", OllamaChatRequest,
              "OllamaChat", True),
    Operation("POST", "/api/generate", "Generate (Ollama); streams NDJSON unless \"stream\": false",
              OllamaGenerateRequest, "OllamaGenerate", True),
    Operation("POST", "/api/embed", "Embeddings (Ollama; a pooling model)", OllamaEmbedRequest,
              "OllamaEmbed"),
    Operation("POST", "/api/embeddings", "One embedding, the older route (Ollama; a pooling model)",
              OllamaEmbeddingsRequest, "OllamaEmbeddings"),
    Operation("GET", "/api/tags", "The served model (Ollama)", None, "OllamaTags"),
    Operation("POST", "/api/show", "The served model's details (Ollama)", OllamaShowRequest, "OllamaShow"),
    Operation("GET", "/api/ps", "The loaded model (Ollama)", None, "OllamaPs"),
    Operation("GET", "/api/version", "The Ollama API version these routes follow", None, "Version"),
    Operation("POST", "/api/pull", "Refused: no downloads (Ollama)", OllamaModelRequest),
    Operation("POST", "/api/push", "Refused: no uploads (Ollama)", OllamaModelRequest),
    Operation("POST", "/api/create", "Refused: no model creation (Ollama)", OllamaModelRequest),
    Operation("POST", "/api/copy", "Refused: no model copies (Ollama)", OllamaCopyRequest),
    Operation("DELETE", "/api/delete", "Refused: models are not deleted (Ollama)", OllamaModelRequest),
]
# The chat page (absent with --no-web-ui, where / answers in plain text).
PAGE_OPERATIONS = [
    Operation("GET", "/", "The chat page", media_type="text/html", public=True),
    Operation("GET", "/web/app.js", "The chat page's script", media_type="text/javascript", public=True),
    Operation("GET", "/web/markdown.js", "The chat page's Markdown renderer", media_type="text/javascript", public=True),
    Operation("GET", "/web/style.css", "The chat page's style sheet", media_type="text/css", public=True),
]
ROOT_OPERATION = Operation("GET", "/", "Says that the server runs", media_type="text/plain", public=True)


def operations(web_ui: bool) -> list[Operation]:
    """Every route of an app with (or without) the chat page."""
    return OPERATIONS + (PAGE_OPERATIONS if web_ui else [ROOT_OPERATION])


def openapi_document(version: str, model_names: list[str], web_ui: bool = True) -> dict:
    """The document; `model` fields name the models this server serves (any other name is a 404)."""
    documented = operations(web_ui)
    requests = [op.request for op in documented if op.request is not None]
    refs, components = msgspec.json.schema_components(requests, ref_template=REF)
    for name in {request.__name__ for request in requests}:
        properties = components[name]["properties"]
        if "model" in properties:
            served = {"enum": list(model_names)}
            optional = "model" not in components[name].get("required", ())
            properties["model"] = _nullable(served) if optional else served
    body_refs = dict(zip(requests, refs, strict=True))
    clashes = components.keys() & RESPONSE_SCHEMAS.keys()
    if clashes:
        raise RuntimeError(f"response schema names clash with request types: {clashes}")
    components.update(RESPONSE_SCHEMAS)
    paths: dict[str, dict] = {}
    for op in documented:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, body_refs.get(op.request))
    return {"openapi": "3.1.0",
            "info": {"title": "ringserve", "version": version,
                     "description": "OpenAI-, Anthropic- and Ollama-compatible LLM serving"},
            "paths": paths, "components": {"schemas": components,
                                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                                               "apiKey": {"type": "apiKey", "in": "header",
                                                                          "name": "x-api-key"}}}}


def _operation(op: Operation, body_ref: dict | None) -> dict:
    error_name = "AnthropicError" if op.path.startswith("/v1/messages") else \
        "OllamaError" if op.path.startswith("/api/") else "OpenAIError"
    error = {"$ref": REF.format(name=error_name)}
    ok: dict = {"description": "OK"}
    if op.response is not None:
        ok["content"] = {op.media_type: {"schema": {"$ref": REF.format(name=op.response)}}}
    elif op.media_type != "application/json":
        ok["content"] = {op.media_type: {"schema": STR}}
    if op.streams and op.path.startswith("/api/"):
        ok["content"][NDJSON] = {"schema": {"$ref": REF.format(name=op.response)}}     # each line
    elif op.streams:
        event = EVENT_SCHEMAS.get(op.path, "OpenAIEvent")
        ok["content"]["text/event-stream"] = {"schema": {"$ref": REF.format(name=event)}}
    out = {"summary": op.summary, "operationId": f"{op.method.lower()} {op.path}",
           "responses": {"200": ok, "4XX": {"description": "The request was refused",
                                            "content": {"application/json": {"schema": error}}},
                         "5XX": {"description": "The engine is not running, or the server failed",
                                 "content": {"application/json": {"schema": error}}}}}
    if body_ref is not None:
        out["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_ref}}}
    if "{response_id}" in op.path:
        out["parameters"] = [{"name": "response_id", "in": "path", "required": True, "schema": STR}]
    if op.path in SLEEP_PATHS:
        out["parameters"] = [{"name": "model", "in": "query", "required": False, "schema": STR}]
        if op.path == "/sleep":
            out["parameters"].append({"name": "level", "in": "query", "required": False,
                                      "schema": {"enum": ["1", "2"]}})
    if op.path != "/health" and not op.public:
        out["security"] = [{}, {"bearer": []}, {"apiKey": []}]
    return out
