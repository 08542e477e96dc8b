"""The engine: `from engine import LLM, SamplingParams`.

Layout, one subpackage per process (DESIGN §1-2): `client/` runs in the frontend process, `core/` is the
scheduler process, `executor/` the executor processes (and the scheduler's handle on them), `sample/` the
sampler inside each executor; `models/`, `layers/` and `attention/` are the model. This root holds the
public face (`llm.py`) and the contracts every process shares: config, errors, sampling params, outputs,
the cross-process messages, process spawning and the tensor-parallel group.

Names are resolved lazily so that importing a light module (the protocol, the config) never pays for
torch or transformers.
"""

from __future__ import annotations

_EXPORTS = {
    "LLM": "engine.llm",
    "SamplingParams": "engine.sampling_params",
    "StructuredOutputsParams": "engine.sampling_params",
    "EngineConfig": "engine.config",
    "EngineClient": "engine.client.engine_client",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "EngineDeadError": "engine.errors",
    "PoolingParams": "engine.sampling_params",
    "PoolingRequestOutput": "engine.outputs",
    "EmbeddingRequestOutput": "engine.outputs",
    "ScoringRequestOutput": "engine.outputs",
}

__all__ = list(_EXPORTS)


def lazy_exports(package: str, exports: dict[str, str]):
    """A module-level __getattr__ that imports each exported name from its module on first use."""
    def __getattr__(name: str):
        if name in exports:
            import importlib

            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = lazy_exports("engine", _EXPORTS)
