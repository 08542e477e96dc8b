"""The engine's exceptions, in a leaf module every process and layer can import."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option."""


class EngineDeadError(RuntimeError):
    """The engine cannot serve any more: a process died or failed. The message says which and how."""


class ExecutorError(RuntimeError):
    """An executor failed or died; the message says which and how."""


class UnsupportedTaskError(ValueError):
    """The request's kind is not what the model serves: generation from a pooling (embedding) model, or an
    embedding from a generative one. The message says which kind the model is."""
