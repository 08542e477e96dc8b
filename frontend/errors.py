"""Errors with their HTTP status, in the shape of the API that was called: OpenAI's
{"error": {"message", "type", "param", "code"}} everywhere but under /v1/messages, where Anthropic clients
expect {"type": "error", "error": {"type", "message"}}, and under /api/, where Ollama clients expect
{"error": "message"}."""

from __future__ import annotations

import math
import re

import msgspec
import orjson
from starlette.responses import Response

from engine.errors import EngineBusyError
from engine.outputs import EngineDeadError

# msgspec locates a bad value as "... - at `$.messages[0].content`"; the param is what follows "$.".
_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    431: "RequestHeaderFieldsTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
ANTHROPIC_PATH = "/v1/messages"
OLLAMA_PREFIX = "/api/"


class ApiError(Exception):
    """A request the server refuses; `param` names the offending request field when there is one;
    `retry_after`: seconds after which the same request may succeed (sent as Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """The ASGI headers of its JSON response."""
        headers = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(math.ceil(self.retry_after)).encode()))
        return headers


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param,
                      "code": status}}


def anthropic_error_body(status: int, message: str, param: str | None = None) -> dict:
    """Anthropic's error shape has no param field: the message names it."""
    if param and param not in message:
        message = f"{param}: {message}"
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def ollama_error_body(status: int, message: str, param: str | None = None) -> dict:
    """Ollama's error shape is one string: the message names the field."""
    if param and param not in message:
        message = f"{param}: {message}"
    return {"error": message}


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_body_for(path: str, status: int, message: str, param: str | None = None) -> dict:
    """The error body in the shape of the API that `path` belongs to."""
    if is_anthropic_path(path):
        return anthropic_error_body(status, message, param)
    if path.startswith(OLLAMA_PREFIX):
        return ollama_error_body(status, message, param)
    return error_body(status, message, param)


def error_response(error: ApiError, *, body_unread: bool = False, path: str = "") -> Response:
    """body_unread: the request body was not (fully) read, so the connection must not carry another
    request (the client would race the server's half-read stream); "connection: close" says so."""
    headers = {"connection": "close"} if body_unread or error.status in (408, 413) else {}
    if error.retry_after is not None:
        headers["retry-after"] = str(math.ceil(error.retry_after))
    return Response(orjson.dumps(error_body_for(path, error.status, error.message, error.param)),
                    status_code=error.status, media_type="application/json", headers=headers or None)


def from_validation_error(error: msgspec.ValidationError | msgspec.DecodeError) -> ApiError:
    """A msgspec decode failure as a 400 naming the field ("messages[0].content")."""
    text = str(error)
    if isinstance(error, msgspec.DecodeError) and not isinstance(error, msgspec.ValidationError):
        return invalid(f"request body is not valid JSON: {text}")
    match = _PATH.search(text)
    # a mapping's values are located as "logit_bias[...]": the param is the mapping
    param = (match.group(1).replace("[...]", "") or None) if match else None
    message = text[:match.start()] if match else text
    missing = _MISSING.search(message)
    if missing:
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
    return invalid(f"{message} (param {param})" if param else message, param)


def from_engine_error(error: Exception, local_paths: dict[str, str] | None = None) -> ApiError:
    """What the engine raised for one request, as the status it deserves. `local_paths` maps paths on
    this machine (the model file, its directory) to what the client may see instead (the model's name):
    an engine's error text may name files, and clients have no business knowing where they live."""
    if isinstance(error, EngineDeadError):
        return ApiError(503, f"the engine is not running: {hide_paths(str(error), local_paths)}")
    if isinstance(error, EngineBusyError):
        return ApiError(503, hide_paths(str(error), local_paths), retry_after=error.retry_after)
    if isinstance(error, ValueError):
        return invalid(hide_paths(str(error), local_paths))
    return ApiError(500, f"internal error: {type(error).__name__}: {hide_paths(str(error), local_paths)}")


def hide_paths(text: str, local_paths: dict[str, str] | None) -> str:
    """`text` with each local path replaced by its public name, longest path first."""
    for path in sorted(local_paths or (), key=len, reverse=True):
        if path in text:
            text = text.replace(path, local_paths[path])
    return text
