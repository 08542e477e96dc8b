"""What OpenAI's chat and completions responses share on the wire: the chunk and body envelopes, usage,
the plain-text fast path, and `data: [DONE]` at the end of every stream (after an error event too).

A step of plain text (no logprobs, the choice not finishing) is written from two prebuilt byte strings
around the text's JSON: the per-token hot path costs one join.
"""

from __future__ import annotations

import orjson

from frontend.choices import Choice
from frontend.errors import ApiError, error_body
from frontend.http_responses import SSE_HEADERS, sse
from frontend.runner import Run, Step

SSE_DONE = b"data: [DONE]\n\n"
_TEXT_PROBE = "\x00"                       # stands in for a chunk's text to split it into prebuilt parts
_TEXT_PROBE_JSON = orjson.dumps(_TEXT_PROBE)


class OpenAIWire:
    """The shared half of a chat or completions Wire (frontend/runner.py); subclasses give the choice items."""

    stream_headers = SSE_HEADERS
    object_name = ""                         # a stream chunk's "object"

    def __init__(self, run: Run, model: str, *, include_usage: bool, logprobs: int | None):
        self.run = run
        self.model = model
        self.include_usage = include_usage
        self.logprobs = logprobs             # per-token logprobs asked for (None: not asked)

    # ------------------------------------------------------------------ a stream
    def head(self) -> bytes:
        for choice in self.run.choices:
            head, _, tail = sse(self.chunk_for(self.text_item(choice, _TEXT_PROBE))).partition(_TEXT_PROBE_JSON)
            choice.chunk_head, choice.chunk_tail = head, tail
        return b""

    def frames(self, step: Step) -> bytes:
        choice = step.choice
        if not step.finished and self.logprobs is None:
            if not step.text:
                return b""
            return choice.chunk_head + orjson.dumps(step.text) + choice.chunk_tail
        return sse(self.step_chunk(step))

    def tail(self) -> bytes:
        if not self.include_usage:
            return SSE_DONE
        usage = {"id": self.run.request_id, "object": self.object_name, "created": self.run.created,
                 "model": self.model, "choices": [], "usage": self.usage()}
        return sse(usage) + SSE_DONE

    def error_frames(self, error: ApiError) -> bytes:
        return sse(error_body(error.status, error.message)) + SSE_DONE

    # ------------------------------------------------------------------ a whole response
    def take(self, step: Step) -> None:
        """The choices keep their whole output themselves (keep_output)."""

    def error_body(self, error: ApiError) -> dict:
        return error_body(error.status, error.message, error.param)

    # ------------------------------------------------------------------ shapes
    def usage(self) -> dict:
        run = self.run
        completion = run.output_tokens
        return {"prompt_tokens": run.prompt_tokens, "completion_tokens": completion,
                "total_tokens": run.prompt_tokens + completion}

    def chunk_for(self, item: dict) -> dict:
        """A stream chunk carrying one choice's item (with "usage": null when usage comes at the end)."""
        run = self.run
        chunk = {"id": run.request_id, "object": self.object_name, "created": run.created, "model": self.model,
                 "choices": [item]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def body_for(self, object_name: str, choices: list[dict]) -> dict:
        """A whole (non-streaming) response."""
        run = self.run
        return {"id": run.request_id, "object": object_name, "created": run.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    def text_item(self, choice: Choice, text: str) -> dict:
        """The item of a step that adds text and neither finishes nor carries logprobs."""
        raise NotImplementedError

    def step_chunk(self, step: Step) -> dict:
        """The chunk of any other step."""
        raise NotImplementedError
