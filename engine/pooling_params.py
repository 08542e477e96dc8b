"""PoolingParams: what a pooling request (an embedding) asks for, with vLLM's names.

The engine pools the model's hidden states into one float32 vector per request (engine/models/pooler_config.py
says how); what happens to that vector afterwards is per request and done by the client: `dimensions` keeps
the first d components (Matryoshka models only), `normalize` L2-normalizes what is kept (default: the
model's own Normalize module). `truncate_prompt_tokens` applies when the prompt is tokenized: -1 truncates to
the model's max length, k to k tokens; without it a prompt over the max length is an error.
"""

from __future__ import annotations

import msgspec


class PoolingParams(msgspec.Struct, kw_only=True, array_like=True, omit_defaults=False):
    truncate_prompt_tokens: int | None = None
    dimensions: int | None = None
    normalize: bool | None = None

    def __post_init__(self) -> None:
        t = self.truncate_prompt_tokens
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or (t < 1 and t != -1)):
            raise ValueError(f"truncate_prompt_tokens must be -1 (the model's max length) or a positive "
                             f"integer, got {t!r}")
        d = self.dimensions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"dimensions must be a positive integer, got {d!r}")
