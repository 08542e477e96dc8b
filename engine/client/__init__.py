"""The frontend process's side of the engine.

`base.py` says what a client is to the frontend (`AsyncEngine`, the face the HTTP server calls) and holds
the start/stop every client shares. `EngineClient` (`engine_client.py`) spawns the scheduler process
(`engine.core.main`), owns the request ring to it and the output ring from it, and turns each step's
EngineOutputs into per-request deltas (`output_processor.py`). `tokenizer.py` loads the tokenizer and the model's generation defaults;
`detokenizer.py` turns token ids into text incrementally and finds stop strings (server and `LLM` alike).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "EngineClient":
        from engine.client.engine_client import EngineClient

        return EngineClient
    raise AttributeError(f"module 'engine.client' has no attribute {name!r}")
