"""One chat turn for the agent APIs (Anthropic Messages, OpenAI Responses), which are layers over chat.

Each API translates its request into a ChatCompletionRequest and runs it here through the chat path: the
same checks, chat template, sampling params and engine stream as /v1/chat/completions, with n=1. What comes
back is a small vocabulary of events that both APIs translate into their own shapes: answer text, reasoning
text, the start of a tool call and its argument fragments. Splitting the raw model text into these is the
chat path's own output parser (frontend.chat.output: --reasoning-parser, then the request's tool plan from
frontend.chat.tool_choice, whose required and named choices add the grammar that forces the call), whose OpenAI
delta fields `ChatDeltaEvents` renames into turn events; with neither in play every token is answer text.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from starlette.requests import Request

from frontend.chat.output import ChatOutputOptions, ChatOutputParser
from frontend.choices import Choice, stream_choice
from frontend.errors import ApiError, from_engine_error
from frontend.chat.protocol import ChatCompletionRequest
from frontend.chat.reasoning import get_reasoning_parser
from frontend.serving_engine import OpenAIServing, ServingContext
from frontend.chat.structured_outputs import structured_outputs
from frontend.chat.tool_choice import check_tools, forced_call_constraint, plan_tools

TEXT = "text"
REASONING = "reasoning"
TOOL_CALL = "tool_call"        # a tool call starts; the event's text is the tool's name
TOOL_ARGS = "tool_args"        # a fragment of the current tool call's JSON arguments


@dataclass(slots=True)
class TurnEvent:
    kind: str
    text: str


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str = ""


class OutputParser(Protocol):
    """Turns the model's text, fed as it is detokenized, into turn events."""

    def feed(self, text: str) -> list[TurnEvent]: ...

    def finish(self) -> list[TurnEvent]: ...


class TextOnly:
    """Every token is answer text."""

    def feed(self, text: str) -> list[TurnEvent]:
        return [TurnEvent(TEXT, text)] if text else []

    def finish(self) -> list[TurnEvent]:
        return []


class ChatDeltaEvents:
    """The chat output parser's deltas ({"reasoning"}, {"content"}, {"tool_calls": [...]}) as turn events."""

    def __init__(self, parser: ChatOutputParser):
        self._parser = parser

    def feed(self, text: str) -> list[TurnEvent]:
        return _events(self._parser.feed(text))

    def finish(self) -> list[TurnEvent]:
        return _events(self._parser.finish())


def _events(deltas: list[dict]) -> list[TurnEvent]:
    events = []
    for delta in deltas:
        if delta.get("reasoning"):
            events.append(TurnEvent(REASONING, delta["reasoning"]))
        if delta.get("content"):
            events.append(TurnEvent(TEXT, delta["content"]))
        for call in delta.get("tool_calls", ()):
            function = call["function"]
            if function.get("name") is not None:
                events.append(TurnEvent(TOOL_CALL, function["name"]))
            if function.get("arguments"):
                events.append(TurnEvent(TOOL_ARGS, function["arguments"]))
    return events


@dataclass(slots=True)
class Turn:
    """One generation on its way; `events()` drives it and keeps the whole output for the final object."""

    engine: object
    choice: Choice
    prompt_tokens: int
    parser: OutputParser
    data_parallel_rank: int | None = None     # X-data-parallel-rank: the engine the request is pinned to
    structured: str | None = None             # the API field of its grammar constraint, if any
    local_paths: dict | None = None           # paths an engine error may name, and what clients see instead
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    _stream: AsyncIterator | None = None
    _first: tuple | None = None

    async def start(self) -> None:
        """Submit the request and wait for its first step. A constrained request calls this before it sends
        anything, so that a grammar the engine refuses is still an error response with its own status."""
        self._stream = stream_choice(self.engine, self.choice, data_parallel_rank=self.data_parallel_rank)
        try:
            self._first = await self._stream.__anext__()
        except StopAsyncIteration:
            pass
        except BaseException:
            await self._stream.aclose()
            raise

    async def events(self) -> AsyncIterator[TurnEvent]:
        """The turn's events in order; closing the iterator early aborts the engine request."""
        if self._stream is None:
            self._stream = stream_choice(self.engine, self.choice, data_parallel_rank=self.data_parallel_rank)
        async with aclosing(self._stream) as stream:
            if self._first is not None:
                for event in self.parser.feed(self._first[1]):
                    self._keep(event)
                    yield event
            async for _, text, _ in stream:
                for event in self.parser.feed(text):
                    self._keep(event)
                    yield event
        for event in self.parser.finish():
            self._keep(event)
            yield event

    def error(self, e: Exception) -> ApiError:
        """What failed the turn, as the API error it is; an engine-side grammar failure names the field."""
        error = from_engine_error(e, self.local_paths)
        if error.status == 400 and error.param is None and self.structured is not None:
            error.param = self.structured
        return error

    def _keep(self, event: TurnEvent) -> None:
        if event.kind == TEXT:
            self.text += event.text
        elif event.kind == REASONING:
            self.reasoning += event.text
        elif event.kind == TOOL_CALL:
            self.tool_calls.append(ToolCall(event.text))
        else:
            self.tool_calls[-1].arguments += event.text

    @property
    def finish_reason(self) -> str | None:
        """"stop" (EOS, stop token or stop string), "length" or "abort", as the engine says."""
        return self.choice.finish_reason

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the turn, if one did."""
        reason = self.choice.stop_reason
        return reason if isinstance(reason, str) else None

    @property
    def output_tokens(self) -> int:
        return self.choice.num_output_tokens

    @property
    def cached_tokens(self) -> int:
        return self.choice.num_cached_tokens


class AgentServing(OpenAIServing):
    """The shared base of the agent API handlers: run a translated chat request as one Turn."""

    def __init__(self, ctx: ServingContext):
        super().__init__(ctx)
        name = ctx.config.reasoning_parser
        self.reasoning_parser = get_reasoning_parser(name) if name else None

    async def start_turn(self, request: Request, chat: ChatCompletionRequest, arrival: float, request_id: str, *,
                         names: dict[str, str], prompt_param: str) -> Turn:
        """Check and render `chat`, and prepare its engine request (it starts when events() is iterated),
        as /v1/chat/completions does: the tool plan, the template with the tools, the reasoning parser's
        state, the grammar of a forced call or the request's own structured output.

        `names` maps chat fields to this API's names for error messages ("max_tokens" -> "max_output_tokens").
        """
        config = self.ctx.config
        try:
            plan = plan_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls,
                              tool_call_parser=config.tool_call_parser,
                              enable_auto_tool_choice=config.enable_auto_tool_choice,
                              exclude_tools_when_tool_choice_none=config.exclude_tools_when_tool_choice_none)
            prompt_text, prompt = await self.render_chat(chat, chat.add_special_tokens,
                                                         tools=plan.template_tools if plan else None)
            reasoning = self.reasoning_parser
            options = ChatOutputOptions(reasoning, reasoning.initial_state(prompt_text) if reasoning else 0, plan)
            if plan is not None and plan.forced:
                structured = await forced_call_constraint(chat, plan, reasoning, options.reasoning_state)
                structured_param = "tool_choice"
            else:
                structured, structured_param = await structured_outputs(chat)
        except ApiError as e:
            raise _renamed(e, names) from None
        params = self.sampling_params(chat, logprobs=None, prompt_logprobs=None, names=names,
                                      structured_outputs=structured)
        if plan is not None and plan.parser is not None and plan.parser.keeps_special_tokens:
            params = msgspec.structs.replace(params, skip_special_tokens=False)
        params = self.prompt_params(params, len(prompt), chat.max_tokens, names.get("max_tokens", "max_tokens"),
                                    prompt_param)
        [choice] = self.make_choices(request_id, [prompt], [params], 1, arrival, keep_output=False)
        parser = ChatDeltaEvents(ChatOutputParser(options)) if options.active else TextOnly()
        structured_field = _renamed_param(structured_param, names) if structured_param else None
        return Turn(self.engine, choice, len(prompt), parser, self.data_parallel_rank(request), structured_field,
                    self.ctx.local_paths)

    async def count_prompt_tokens(self, chat: ChatCompletionRequest) -> int:
        """Tokens of the prompt `chat` renders to (count_tokens, with the tools the template is given)."""
        tools = chat.tools
        if tools is not None:
            check_tools(tools)
            if chat.tool_choice == "none" and self.ctx.config.exclude_tools_when_tool_choice_none:
                tools = None
        return len((await self.render_chat(chat, chat.add_special_tokens, tools=tools))[1])


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
