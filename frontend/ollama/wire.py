"""How a run is written in Ollama's shapes: newline-delimited JSON objects while it streams (the default),
or one object with "stream": false; /api/chat puts the text under message.content (and message.thinking,
message.tool_calls), /api/generate under response (and thinking, and the token ids of the whole exchange
under context). The last object says done: true with done_reason and the timings in nanoseconds
(total_duration, load_duration, prompt_eval_count and _duration, eval_count and _duration).

One assembler serves both modes, so a stream and a whole answer carry the same text by construction. Tool
calls are sent whole (Ollama's arguments are objects, not JSON text): in one object before the last. A step
of plain text is written from prebuilt bytes around its JSON string: the per-token hot path is one join.
"""

from __future__ import annotations

import time

import orjson

from frontend.chat.output import CONTENT, REASONING, TOOL_CALL, Part
from frontend.errors import ApiError, ollama_error_body
from frontend.runner import Run, Step

NDJSON_HEADERS = [(b"content-type", b"application/x-ndjson")]
NS = 1_000_000_000


class _Clock:
    """created_at as RFC 3339 in UTC with microseconds; the part up to the second is formatted once a second."""

    __slots__ = ("second", "prefix")

    def __init__(self):
        self.second = -1
        self.prefix = b""

    def now(self) -> bytes:
        t = time.time()
        second = int(t)
        if second != self.second:
            self.second, self.prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
        return b"%s.%06dZ" % (self.prefix, int((t - second) * 1e6))


_clock = _Clock()


def created_at() -> str:
    return _clock.now().decode()


class OllamaWire:
    """A run of one choice as Ollama's chat (`chat=True`) or generate answer."""

    stream_headers = NDJSON_HEADERS

    def __init__(self, run: Run, model: str, *, chat: bool, context: list[int] | None = None):
        self.run = run
        self.model = model
        self.chat = chat
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.calls: dict[int, list] = {}            # index -> [id, name, arguments so far]
        self.context = context                      # generate: the prompt's ids, then the answer's
        name = orjson.dumps(model)
        self._head = b'{"model":' + name + b',"created_at":"'
        self._text = b'","message":{"role":"assistant","content":' if chat else b'","response":'
        self._tail = b'},"done":false}\n' if chat else b',"done":false}\n'

    # ------------------------------------------------------------------ a stream
    def head(self) -> bytes:
        return b""

    def frames(self, step: Step) -> bytes:
        if self.context is not None:
            self.context.extend(step.delta.new_token_ids)
        if step.parts is None:
            if not step.text:
                return b""
            return self._head + _clock.now() + self._text + orjson.dumps(step.text) + self._tail
        content, thinking = self._read(step.parts)
        if not content and not thinking:
            return b""
        return self._line(self._delta(content, thinking), done=False)

    def tail(self) -> bytes:
        frames = b""
        if self.calls:
            frames = self._line(self._delta("", "", tool_calls=self._tool_calls()), done=False)
        return frames + self._line(self._delta("", ""), done=True)

    def error_frames(self, error: ApiError) -> bytes:
        return orjson.dumps(self.error_body(error)) + b"\n"

    # ------------------------------------------------------------------ a whole answer
    def take(self, step: Step) -> None:
        if self.context is not None:
            self.context.extend(step.delta.new_token_ids)
        if step.parts is None:
            if step.text:
                self.content.append(step.text)
        else:
            self._read(step.parts)

    def body(self) -> dict:
        fields = self._delta("".join(self.content), "".join(self.thinking),
                             tool_calls=self._tool_calls() if self.calls else None)
        return self._object(fields, done=True)

    def error_body(self, error: ApiError) -> dict:
        return ollama_error_body(error.status, error.message, error.param)

    # ------------------------------------------------------------------ shapes
    def _read(self, parts: list[Part]) -> tuple[str, str]:
        """A step's parts: its content and thinking text (also kept), its tool calls gathered."""
        content, thinking = [], []
        for part in parts:
            if part.kind == CONTENT:
                content.append(part.text)
            elif part.kind == REASONING:
                thinking.append(part.text)
            elif part.kind == TOOL_CALL:
                call = part.call
                entry = self.calls.setdefault(call.index, [None, "", ""])
                if call.name is not None:
                    entry[0], entry[1] = call.id, call.name
                entry[2] += call.arguments
        text, reasoning = "".join(content), "".join(thinking)
        if text:
            self.content.append(text)
        if reasoning:
            self.thinking.append(reasoning)
        return text, reasoning

    def _tool_calls(self) -> list[dict]:
        calls = []
        for index in sorted(self.calls):
            call_id, name, arguments = self.calls[index]
            if not name:
                continue
            call = {"function": {"index": index, "name": name, "arguments": _arguments(arguments)}}
            if call_id:
                call["id"] = call_id
            calls.append(call)
        return calls

    def _delta(self, content: str, thinking: str, tool_calls: list[dict] | None = None) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {"message": message}
        fields = {"response": content}
        if thinking:
            fields["thinking"] = thinking
        return fields

    def _line(self, fields: dict, *, done: bool) -> bytes:
        return orjson.dumps(self._object(fields, done=done)) + b"\n"

    def _object(self, fields: dict, *, done: bool) -> dict:
        out = {"model": self.model, "created_at": created_at(), **fields, "done": done}
        if done:
            out.update(self._summary())
        return out

    def _summary(self) -> dict:
        """done_reason and the timings (ns) of the finished run."""
        choice = self.run.choices[0]
        end = time.monotonic()
        first = choice.first_token_time or end
        started = choice.scheduled_time or choice.arrival_time
        out = {"done_reason": "length" if choice.finish_reason == "length" else "stop",
               "total_duration": int((end - choice.arrival_time) * NS), "load_duration": 0,
               "prompt_eval_count": len(choice.prompt_token_ids),
               "prompt_eval_duration": int(max(first - started, 0.0) * NS),
               "eval_count": choice.num_output_tokens,
               "eval_duration": int(max((choice.last_token_time or first) - first, 0.0) * NS)}
        if self.context is not None:
            out["context"] = self.context
        return out


def _arguments(text: str) -> dict:
    """A call's arguments as an object; arguments cut short (num_predict) or malformed give {}."""
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
