"""The engine's exceptions, in a leaf module every process and layer can import."""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option."""


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more: a process died or failed. The message says which and how."""


class ExecutorError(RuntimeError):
    """An executor failed or died; the message says which and how."""


class EngineBusyError(ValueError):
    """The engine refused one request for now (too much work of its kind queued); the same request may
    succeed after `retry_after` seconds. A ValueError, as every refusal of one request is."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


_BUSY = re.compile(r"^\[busy: retry after (\d+(?:\.\d+)?) s\] ")


def busy_message(message: str, retry_after: float) -> str:
    """The text of a busy refusal as it crosses the output ring (EngineOutputs.errors carries text)."""
    return f"[busy: retry after {retry_after:g} s] {message}"


def request_error(message: str) -> ValueError:
    """What one request's engine-side failure raises in the client: EngineBusyError for a busy refusal,
    else ValueError (the request was at fault: a grammar that did not compile, say)."""
    match = _BUSY.match(message)
    if match is None:
        return ValueError(message)
    return EngineBusyError(message[match.end():], float(match.group(1)))


class UnsupportedTaskError(ValueError):
    """The request's kind is not what the model serves: generation from a pooling (embedding) model, or an
    embedding from a generative one. The message says which kind the model is."""
