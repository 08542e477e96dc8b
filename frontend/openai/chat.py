"""POST /v1/chat/completions: the chat preparation (frontend/chat/preparation.py), then the runner; this
module only writes the result in OpenAI's shapes.

With tools or a reasoning parser, each streamed choice's parts (frontend/chat/output.py) become
`reasoning` / `content` / `tool_calls` deltas, one chunk each; a whole response reads each choice's text
with `parse_message`, which runs the same parsers over it.
"""

from __future__ import annotations

import time

from starlette.requests import Request

from frontend.chat.output import CONTENT, REASONING, REASONING_FIELDS, ChatOutputOptions, Part, parse_message
from frontend.chat.preparation import ChatPreparation, PreparedChat
from frontend.chat.protocol import ChatCompletionRequest
from frontend.chat.template import text_content
from frontend.choices import Choice
from frontend.http_responses import DisconnectAwareResponse, sse
from frontend.openai.logprobs import chat_logprobs, prompt_logprobs_json
from frontend.openai.wire import OpenAIWire
from frontend.runner import Run, Step
from frontend.serving_engine import OpenAIServing, ServingContext


class OpenAIServingChat(OpenAIServing):
    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        self.chat = ChatPreparation(self)
        self.reasoning_fields = REASONING_FIELDS[ctx.config.reasoning_field]

    async def create_chat_completion(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, ChatCompletionRequest)
        self.check_engine()
        prepared = await self.chat.prepare(req)
        response_id = self.new_id("chatcmpl")
        run = self.run(request, response_id, [prepared.prompt], [prepared.params], req.n, arrival,
                       keep_output=not req.stream, echo_texts=echo_texts(req),
                       parsers=prepared.parsers(req.n) if req.stream else None, priority=req.priority,
                       cache_salt=req.cache_salt, structured=prepared.structured)
        wire = ChatCompletionWire(run, self.ctx, prepared, self.reasoning_fields, include_usage=req.include_usage,
                                  prompt_logprobs=req.prompt_logprobs is not None)
        return run.respond(wire, req.stream)


class ChatCompletionWire(OpenAIWire):
    object_name = "chat.completion.chunk"

    def __init__(self, run: Run, ctx: ServingContext, prepared: PreparedChat, reasoning_fields: tuple[str, ...], *,
                 include_usage: bool, prompt_logprobs: bool):
        super().__init__(run, ctx.model_name, include_usage=include_usage, logprobs=prepared.logprobs)
        self.token_strings = ctx.token_strings
        self.output: ChatOutputOptions | None = prepared.output if prepared.output.active else None
        self.reasoning_fields = reasoning_fields
        self.prompt_logprobs = prompt_logprobs
        if run.parsers is not None:           # read output: one chunk per part (else the plain fast path)
            self.frames = self._parsed_frames

    def head(self) -> bytes:
        super().head()
        # the role chunk never finishes the choice, even when the first step came before it (a stream with a
        # grammar waits for its first step before it sends anything)
        return b"".join(sse(self.chunk_for({"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None, "stop_reason": None}))
                        for choice in self.run.choices)

    def text_item(self, choice: Choice, text: str) -> dict:
        return {"index": choice.index, "delta": {"content": text}, "logprobs": None, "finish_reason": None,
                "stop_reason": None}

    def _parsed_frames(self, step: Step) -> bytes:
        return b"".join(sse(chunk) for chunk in self._parsed_chunks(step))

    def step_chunk(self, step: Step) -> dict:
        choice, text = step.choice, step.text
        return self.chunk_for({
            "index": choice.index, "delta": {"content": text} if text or not step.finished else {},
            "logprobs": self._logprobs(step), "finish_reason": choice.finish_reason if step.finished else None,
            "stop_reason": choice.stop_reason if step.finished else None,
        })

    def _parsed_chunks(self, step: Step) -> list[dict]:
        """One chunk per part; the step's logprobs ride on the first, the finish on the last."""
        choice = step.choice
        deltas = [self._delta(part) for part in step.parts]
        logprobs = self._logprobs(step)
        if not deltas and (step.finished or logprobs is not None):
            deltas = [{}]                     # the step still reports its logprobs or the finish
        last = len(deltas) - 1
        parser = self.run.parsers[choice.index]
        return [self.chunk_for({
            "index": choice.index, "delta": fields, "logprobs": logprobs if i == 0 else None,
            "finish_reason": parser.finish_reason(choice.finish_reason) if step.finished and i == last else None,
            "stop_reason": choice.stop_reason if step.finished and i == last else None,
        }) for i, fields in enumerate(deltas)]

    def _delta(self, part: Part) -> dict:
        if part.kind == CONTENT:
            return {"content": part.text}
        if part.kind == REASONING:
            return dict.fromkeys(self.reasoning_fields, part.text)
        return {"tool_calls": [part.call.to_openai()]}

    def _logprobs(self, step: Step) -> dict | None:
        if self.logprobs is None or not step.delta.logprobs:
            return None
        return chat_logprobs(step.delta.logprobs, self.token_strings, self.logprobs)

    def body(self) -> dict:
        strs = self.token_strings
        output = self.output
        choices = []
        for choice in self.run.choices:
            logprobs = chat_logprobs(choice.logprobs, strs, self.logprobs) if self.logprobs is not None else None
            finish_reason = choice.finish_reason
            if output is None:
                message = {"role": "assistant", "content": choice.text}
            else:
                message, has_calls = parse_message(output, choice.text, self.reasoning_fields)
                if has_calls and output.tool_plan.mode == "auto":
                    finish_reason = "tool_calls"
            choices.append({"index": choice.index, "message": message, "logprobs": logprobs,
                            "finish_reason": finish_reason, "stop_reason": choice.stop_reason})
        body = self.body_for("chat.completion", choices)
        if self.prompt_logprobs:
            body["prompt_logprobs"] = prompt_logprobs_json(self.run.choices[0].prompt_logprobs, strs)
        return body


def echo_texts(req: ChatCompletionRequest) -> list[str] | None:
    """With echo, the reply is prefixed by the final message's text if that message is the assistant's."""
    final = req.messages[-1]
    if not req.echo or final.role != "assistant" or final.content is None:
        return None
    return [text_content(final.content, len(req.messages) - 1)]
