"""POST /v1/chat/completions: messages through the chat template, then the shared generation path.

With tools or a reasoning parser, each choice's output goes through frontend.chat.output (reasoning split,
tool calls parsed), streamed as `reasoning` / `content` / `tool_calls` deltas; `required` and named
tool choices add the grammar that forces the call (frontend.chat.tool_choice).
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request

from engine.outputs import RequestDelta
from frontend.chat.output import REASONING_FIELDS, ChatOutputOptions, ChatOutputParser, parse_message
from frontend.chat.template import text_content
from frontend.choices import Choice
from frontend.errors import invalid
from frontend.openai.logprobs import chat_logprobs, prompt_logprobs_json
from frontend.chat.protocol import ChatCompletionRequest
from frontend.chat.reasoning import get_reasoning_parser
from frontend.http_responses import DisconnectAwareResponse, sse_event
from frontend.serving_engine import GenerationJob, OpenAIServing, ServingContext
from frontend.chat.structured_outputs import structured_outputs
from frontend.chat.tool_choice import forced_call_constraint, plan_tools

_NAMES = {"logprobs": "top_logprobs"}


class OpenAIServingChat(OpenAIServing):
    object_name = "chat.completion.chunk"

    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        config = ctx.config
        self.reasoning_parser = get_reasoning_parser(config.reasoning_parser) if config.reasoning_parser else None
        self.reasoning_fields = REASONING_FIELDS[config.reasoning_field]

    async def create_chat_completion(self, request: Request) -> DisconnectAwareResponse:
        arrival = time.monotonic()
        req = await self.read(request, ChatCompletionRequest)
        self.check_engine()
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid("top_logprobs needs logprobs to be true", "top_logprobs")
        config = self.ctx.config
        compact = req.structured_outputs is not None and req.structured_outputs.disable_any_whitespace
        plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls,
                          tool_call_parser=config.tool_call_parser,
                          enable_auto_tool_choice=config.enable_auto_tool_choice,
                          exclude_tools_when_tool_choice_none=config.exclude_tools_when_tool_choice_none,
                          max_whitespace_cnt=1 if compact else None)
        prompt_text, prompt = await self.render_chat(req, req.add_special_tokens,
                                                     tools=plan.template_tools if plan else None)
        reasoning = self.reasoning_parser
        options = ChatOutputOptions(reasoning, reasoning.initial_state(prompt_text) if reasoning else 0, plan,
                                    req.include_reasoning, self.reasoning_fields)
        if plan is not None and plan.forced:
            structured = await forced_call_constraint(req, plan, reasoning, options.reasoning_state)
            structured_param = "tool_choice"
        else:
            structured, structured_param = await structured_outputs(req)

        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        max_tokens, max_tokens_param = req.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens, max_tokens_param = req.max_tokens, "max_tokens"
        names = {**_NAMES, "max_tokens": max_tokens_param}
        params = self.sampling_params(req, logprobs=logprobs, prompt_logprobs=req.prompt_logprobs, names=names,
                                      structured_outputs=structured)
        if plan is not None and plan.parser is not None and plan.parser.keeps_special_tokens:
            params = msgspec.structs.replace(params, skip_special_tokens=False)
        params = self.prompt_params(params, len(prompt), max_tokens, max_tokens_param, "messages")
        response_id = self.new_id("chatcmpl")
        choices = self.make_choices(response_id, [prompt], [params], req.n, arrival,
                                    keep_output=not req.stream, echo_texts=echo_texts(req))
        job = GenerationJob(
            response_id=response_id, created=int(time.time()), choices=choices,
            prompt_tokens=len(prompt), stream=req.stream, include_usage=req.include_usage, logprobs=logprobs,
            priority=req.priority, cache_salt=req.cache_salt, prompt_logprobs=req.prompt_logprobs is not None,
            data_parallel_rank=self.data_parallel_rank(request), structured=structured_param,
        )
        if options.active:
            job.output_parsers = [ChatOutputParser(options) for _ in choices]
        job.chat_output = options
        return self.respond(job)

    def _prelude(self, job: GenerationJob) -> list[bytes]:
        chunks = []
        for choice in job.choices:
            chunk = self._chunk(job, choice, "", None)
            # the role chunk never finishes the choice, even when the first event came before it (a stream
            # with a grammar waits for its first event before it sends anything)
            chunk["choices"][0].update(delta={"role": "assistant", "content": ""}, finish_reason=None,
                                       stop_reason=None)
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

    def _parsed_chunks(self, job: GenerationJob, choice: Choice, text: str, delta: RequestDelta) -> list[bytes]:
        parser: ChatOutputParser = job.output_parsers[choice.index]
        deltas = parser.feed(text)
        finishing = choice.finish_reason is not None
        if finishing:
            deltas += parser.finish()
        logprobs = None
        if job.logprobs is not None and delta.logprobs:
            logprobs = chat_logprobs(delta.logprobs, self.ctx.token_strings, job.logprobs)
        if not deltas and (finishing or logprobs is not None):
            deltas = [{}]                     # the step still reports its logprobs or the finish
        chunks = []
        last = len(deltas) - 1
        for i, fields in enumerate(deltas):
            end = finishing and i == last
            chunks.append(sse_event(self.chunk_for(job, {
                "index": choice.index, "delta": fields, "logprobs": logprobs if i == 0 else None,
                "finish_reason": parser.finish_reason(choice.finish_reason) if end else None,
                "stop_reason": choice.stop_reason if end else None,
            })))
        return chunks

    def _response_body(self, job: GenerationJob) -> dict:
        strs = self.ctx.token_strings
        options: ChatOutputOptions | None = job.chat_output if job.output_parsers is not None else None
        choices = []
        for choice in job.choices:
            logprobs = chat_logprobs(choice.logprobs, strs, job.logprobs) if job.logprobs is not None else None
            finish_reason = choice.finish_reason
            if options is None:
                message = {"role": "assistant", "content": choice.text}
            else:
                message, has_calls = parse_message(options, choice.text)
                if has_calls and options.tool_plan.mode == "auto":
                    finish_reason = "tool_calls"
            choices.append({"index": choice.index, "message": message, "logprobs": logprobs,
                            "finish_reason": finish_reason, "stop_reason": choice.stop_reason})
        body = self.body_for(job, "chat.completion", choices)
        if job.prompt_logprobs:
            body["prompt_logprobs"] = prompt_logprobs_json(job.choices[0].prompt_logprobs, strs)
        return body


def echo_texts(req: ChatCompletionRequest) -> list[str] | None:
    """With echo, the reply is prefixed by the final message's text if that message is the assistant's."""
    final = req.messages[-1]
    if not req.echo or final.role != "assistant" or final.content is None:
        return None
    return [text_content(final.content, len(req.messages) - 1)]
