"""The one chat preparation: a chat request becomes its engine request (prompt, sampling params, grammar)
plus what reads each choice's output. /v1/chat/completions, /v1/messages and /v1/responses all call
`ChatPreparation.prepare`; the agent APIs first translate their requests into a ChatCompletionRequest.

In order: the tool plan (frontend/chat/tool_choice.py: `tools`, `tool_choice`, the parser that reads
calls); the chat template over the messages and the tools the template is given, in a worker thread; the
reasoning parser (--reasoning-parser), built once per request, and the state its prompt leaves the output
in; the grammar constraint, either the one that forces a `required` or named call (in the model's own call
format, after the reasoning) or the request's own structured output (response_format, structured_outputs,
guided_*); then the sampling params and max_tokens within the context. Errors name the field in the
calling API's own names (`names`: chat field -> API field).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec

from engine.sampling_params import SamplingParams
from frontend.chat.output import ChatOutputOptions, ChatOutputParser
from frontend.chat.protocol import ChatCompletionRequest
from frontend.chat.reasoning import get_reasoning_parser
from frontend.chat.structured_outputs import structured_outputs
from frontend.chat.template import TemplateOutputTooLong, template_messages
from frontend.chat.tool_choice import check_tools, forced_call_constraint, plan_tools
from frontend.errors import ApiError, invalid
from frontend.serving_engine import OpenAIServing

MAX_TEMPLATE_OUTPUT_CHARS = 64 << 20       # a chat template's output, when the tokenizer gives no tighter bound


@dataclass(frozen=True, slots=True)
class PreparedChat:
    """A chat request ready for the engine."""

    prompt: list[int]
    params: SamplingParams                 # for this prompt: max_tokens set, n kept
    output: ChatOutputOptions              # what reads each choice's text (reasoning, tool calls)
    logprobs: int | None                   # top logprobs per token asked for (None: none)
    structured: str | None                 # the API field of its grammar constraint, if any

    def parsers(self, n: int) -> list[ChatOutputParser] | None:
        """One output parser per choice, or None when the text is all content (nothing to read)."""
        return [ChatOutputParser(self.output) for _ in range(n)] if self.output.active else None


class ChatPreparation:
    """The chat side of an API handler (`serving`: its tokenizing, sampling params and context)."""

    def __init__(self, serving: OpenAIServing):
        self.serving = serving
        self.ctx = serving.ctx
        name = self.ctx.config.reasoning_parser
        self._reasoning_parser = type(get_reasoning_parser(name)) if name else None   # an unknown name fails here

    async def prepare(self, chat: ChatCompletionRequest, *, names: dict[str, str] | None = None,
                      prompt_param: str = "messages") -> PreparedChat:
        """Check and render `chat` and build its engine request; raises ApiError (400) naming the field."""
        names = names or {}
        if chat.top_logprobs is not None and not chat.logprobs:
            raise invalid("top_logprobs needs logprobs to be true", names.get("top_logprobs", "top_logprobs"))
        config = self.ctx.config
        compact = chat.structured_outputs is not None and chat.structured_outputs.disable_any_whitespace
        try:
            plan = plan_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls,
                              tool_call_parser=config.tool_call_parser,
                              enable_auto_tool_choice=config.enable_auto_tool_choice,
                              exclude_tools_when_tool_choice_none=config.exclude_tools_when_tool_choice_none,
                              max_whitespace_cnt=1 if compact else None)
            prompt_text, prompt = await self.render(chat, chat.add_special_tokens,
                                                    tools=plan.template_tools if plan else None)
            reasoning = self._reasoning_parser() if self._reasoning_parser else None
            output = ChatOutputOptions(reasoning, reasoning.initial_state(prompt_text) if reasoning else 0, plan,
                                       chat.include_reasoning)
            if plan is not None and plan.forced:
                structured = await forced_call_constraint(chat, plan, reasoning, output.reasoning_state)
                structured_param = "tool_choice"
            else:
                structured, structured_param = await structured_outputs(chat)
        except ApiError as e:
            raise _renamed(e, names) from None
        logprobs = (chat.top_logprobs or 0) if chat.logprobs else None
        max_tokens, max_tokens_param = chat.max_completion_tokens, "max_completion_tokens"
        if max_tokens is None:
            max_tokens, max_tokens_param = chat.max_tokens, "max_tokens"
        max_tokens_param = names.get(max_tokens_param, max_tokens_param)
        serving = self.serving
        params = serving.sampling_params(chat, logprobs=logprobs, prompt_logprobs=chat.prompt_logprobs,
                                         names={"logprobs": "top_logprobs", **names, "max_tokens": max_tokens_param},
                                         structured_outputs=structured)
        if plan is not None and plan.parser is not None and plan.parser.keeps_special_tokens:
            params = msgspec.structs.replace(params, skip_special_tokens=False)
        params = serving.prompt_params(params, len(prompt), max_tokens, max_tokens_param, prompt_param)
        return PreparedChat(prompt, params, output, logprobs,
                            _renamed_param(structured_param, names) if structured_param else None)

    async def render(self, req, add_special_tokens: bool, tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """(prompt text, token ids) of req.messages through the chat template, with the request's
        chat_template_kwargs over --default-chat-template-kwargs; rendered in a worker thread (Jinja is slow),
        its output bounded by the context. `req`: a chat request or /tokenize's messages form."""
        ctx, serving = self.ctx, self.serving
        template = ctx.chat_template
        if template is None:
            raise invalid("this model has no chat template; start the server with --chat-template", "messages")
        rendered = template_messages(req.messages)
        extra = {**ctx.config.default_chat_template_kwargs, **(req.chat_template_kwargs or {})}
        max_chars = ctx.max_prompt_chars or MAX_TEMPLATE_OUTPUT_CHARS

        def render() -> str:
            try:
                return template.render(rendered, add_generation_prompt=req.add_generation_prompt,
                                       continue_final_message=req.continue_final_message, extra=extra,
                                       tools=tools, max_chars=max_chars)
            except TemplateOutputTooLong as e:
                serving.check_prompt_chars(e.length, "messages")
                raise invalid(f"the chat template's output exceeds {max_chars} characters", "messages") from None

        text = await asyncio.to_thread(render)
        return text, (await serving.tokenize_prompts([text], add_special_tokens, "messages"))[0]

    async def count_prompt_tokens(self, chat: ChatCompletionRequest) -> int:
        """Tokens of the prompt `chat` renders to, with the tools the template is given (count_tokens)."""
        tools = chat.tools
        if tools is not None:
            check_tools(tools)
            if chat.tool_choice == "none" and self.ctx.config.exclude_tools_when_tool_choice_none:
                tools = None
        return len((await self.render(chat, chat.add_special_tokens, tools=tools))[1])


def _renamed_param(param: str, names: dict[str, str]) -> str:
    """A chat field path in this API's names (response_format.json_schema.schema -> text.format.schema)."""
    for chat_name in sorted(names, key=len, reverse=True):
        if param == chat_name or param.startswith(chat_name + "."):
            return names[chat_name] + param[len(chat_name):]
    return param


def _renamed(error: ApiError, names: dict[str, str]) -> ApiError:
    if error.param:
        renamed = _renamed_param(error.param, names)
        error.message = error.message.replace(error.param, renamed)
        error.param = renamed
    return error
