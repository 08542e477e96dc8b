"""POST /v1/chat/completions: messages through the chat template, then the shared generation path."""

from __future__ import annotations

import time

from starlette.requests import Request

from engine.outputs import RequestDelta
from frontend.chat_template import text_content
from frontend.choices import Choice
from frontend.errors import invalid
from frontend.logprobs import chat_logprobs, prompt_logprobs_json
from frontend.protocol import ChatCompletionRequest
from frontend.responses import DisconnectAwareResponse, sse_event
from frontend.serving_engine import GenerationJob, OpenAIServing
from frontend.structured_outputs import structured_outputs

_NAMES = {"logprobs": "top_logprobs"}


class OpenAIServingChat(OpenAIServing):
    object_name = "chat.completion.chunk"

    async def create_chat_completion(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, ChatCompletionRequest)
        self.check_engine()
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid("top_logprobs needs logprobs to be true", "top_logprobs")
        check_unsupported(req)
        structured, structured_param = await structured_outputs(req)
        prompt = await self.chat_prompt(req, req.add_special_tokens)

        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        max_tokens, max_tokens_param = req.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens, max_tokens_param = req.max_tokens, "max_tokens"
        names = {**_NAMES, "max_tokens": max_tokens_param}
        params = self.sampling_params(req, logprobs=logprobs, prompt_logprobs=req.prompt_logprobs, names=names,
                                      structured_outputs=structured)
        params = self.prompt_params(params, len(prompt), max_tokens, max_tokens_param, "messages")
        response_id = self.new_id("chatcmpl")
        job = GenerationJob(
            response_id=response_id, created=int(time.time()),
            choices=self.make_choices(response_id, [prompt], [params], req.n, arrival,
                                      keep_output=not req.stream, echo_texts=echo_texts(req)),
            prompt_tokens=len(prompt), stream=req.stream, include_usage=req.include_usage, logprobs=logprobs,
            priority=req.priority, cache_salt=req.cache_salt, prompt_logprobs=req.prompt_logprobs is not None,
            data_parallel_rank=self.data_parallel_rank(request),
            structured=structured_param,
        )
        return self.respond(job)

    def _prelude(self, job: GenerationJob) -> list[bytes]:
        chunks = []
        for choice in job.choices:
            chunk = self._chunk(job, choice, "", None)
            chunk["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            chunks.append(sse_event(chunk))
        return chunks

    def _chunk(self, job: GenerationJob, choice: Choice, text: str, delta: RequestDelta | None) -> dict:
        logprobs = None
        if delta is not None and job.logprobs is not None and delta.logprobs:
            logprobs = chat_logprobs(delta.logprobs, self.ctx.token_strings, job.logprobs)
        finishing = choice.finish_reason is not None
        return self.chunk_for(job, {
            "index": choice.index, "delta": {"content": text} if text or not finishing else {},
            "logprobs": logprobs, "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason,
        })

    def _response_body(self, job: GenerationJob) -> dict:
        strs = self.ctx.token_strings
        choices = []
        for choice in job.choices:
            logprobs = chat_logprobs(choice.logprobs, strs, job.logprobs) if job.logprobs is not None else None
            choices.append({"index": choice.index, "message": {"role": "assistant", "content": choice.text},
                            "logprobs": logprobs, "finish_reason": choice.finish_reason,
                            "stop_reason": choice.stop_reason})
        body = self.body_for(job, "chat.completion", choices)
        if job.prompt_logprobs:
            body["prompt_logprobs"] = prompt_logprobs_json(job.choices[0].prompt_logprobs, strs)
        return body


def check_unsupported(req: ChatCompletionRequest) -> None:
    """Refuse what ringserve cannot do rather than answer as if it had been done (as vLLM does when it
    runs without a tool-call parser)."""
    if req.tools:
        # OpenAI's default tool_choice is "auto" when tools are given.
        if req.tool_choice != "none":
            raise invalid(
                f"tool_choice {req.tool_choice or 'auto'!r} needs tool calls parsed out of the model's output, "
                "which ringserve does not do; send tool_choice 'none' to get a plain answer (the tools are "
                "then left out of the prompt)", "tool_choice")
    elif req.tool_choice not in (None, "none"):
        raise invalid("tool_choice is set but no tools are given", "tool_choice")


def echo_texts(req: ChatCompletionRequest) -> list[str] | None:
    """With echo, the reply is prefixed by the final message's text if that message is the assistant's."""
    final = req.messages[-1]
    if not req.echo or final.role != "assistant" or final.content is None:
        return None
    return [text_content(final.content, len(req.messages) - 1)]
