"""The engine: `from engine import LLM, SamplingParams`.

Names are resolved lazily so that importing a light module (the protocol, the config) never pays for
torch or transformers.
"""

from __future__ import annotations

_EXPORTS = {
    "LLM": "engine.llm",
    "SamplingParams": "engine.sampling_params",
    "EngineConfig": "engine.config",
    "EngineClient": "engine.client",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "EngineDeadError": "engine.outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
