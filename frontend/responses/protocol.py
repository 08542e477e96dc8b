"""OpenAI Responses API request types (POST /v1/responses) as msgspec Structs.

`input` is a string or a list of items. OpenAI's shorthand message item ({role, content}) has no "type",
so the items cannot be a tagged union: an item is one Struct whose fields are the union of the item kinds',
and responses/translate.py checks each kind's required fields, naming the field. Content parts, tools and
text formats carry a "type" and are tagged unions or literals, so the parser itself refuses unknown ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from engine.sampling_params import MAX_STOP_STRINGS
from frontend.chat.protocol import MAX_MESSAGES, PositiveInt, ShortStr, StopString, Temperature, TopP

MAX_ITEMS = MAX_MESSAGES
MAX_TOOLS = 1024
Name = Annotated[str, Meta(min_length=1, max_length=128)]
Id = Annotated[str, Meta(max_length=256)]


class InputText(msgspec.Struct, kw_only=True, tag="input_text", tag_field="type"):
    text: str


class OutputText(msgspec.Struct, kw_only=True, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(msgspec.Struct, kw_only=True, tag="refusal", tag_field="type"):
    refusal: str


class InputImage(msgspec.Struct, kw_only=True, tag="input_image", tag_field="type"):
    """Accepted by the parser so that the refusal names the part (ringserve's models read text only)."""

    image_url: str | None = None
    file_id: Id | None = None
    detail: ShortStr | None = None


class InputFile(msgspec.Struct, kw_only=True, tag="input_file", tag_field="type"):
    file_id: Id | None = None
    file_data: str | None = None
    filename: ShortStr | None = None


class ReasoningText(msgspec.Struct, kw_only=True, tag="reasoning_text", tag_field="type"):
    text: str


class SummaryText(msgspec.Struct, kw_only=True, tag="summary_text", tag_field="type"):
    text: str


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile | ReasoningText
Parts = Annotated[list[ContentPart], Meta(max_length=MAX_ITEMS)]


class InputItem(msgspec.Struct, kw_only=True):
    """message (the default type), function_call, function_call_output or reasoning."""

    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    id: Id | None = None
    status: ShortStr | None = None
    # message
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | Parts | None = None              # a reasoning item's content: reasoning_text parts
    # function_call
    call_id: Id | None = None
    name: Name | None = None
    arguments: str | None = None
    # function_call_output
    output: str | Parts | None = None
    # reasoning
    summary: list[SummaryText] | None = None
    encrypted_content: str | None = None


class Tool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A function tool; OpenAI's built-in server tools (web_search, ...) come with other fields, ignored."""

    type: ShortStr
    name: Name | None = None
    parameters: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ToolChoiceFunction(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: Name


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_schema", "json_object"]
    name: ShortStr | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: ShortStr | None = None


class Reasoning(msgspec.Struct, kw_only=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: ShortStr | None = None
    generate_summary: ShortStr | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: ShortStr | None = None
    input: str | Annotated[list[InputItem], Meta(max_length=MAX_ITEMS)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: Id | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    user: ShortStr | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool = False
    include: list[ShortStr] | None = None
    # vLLM's extensions
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: int | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] | None = None
