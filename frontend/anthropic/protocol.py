"""Anthropic Messages API request types (POST /v1/messages, /v1/messages/count_tokens) as msgspec Structs.

Decoding a body validates it, naming the field of a bad value. Content blocks are a union tagged by "type";
keys that Anthropic clients send but ringserve does not act on (cache_control, citations, metadata,
service_tier, ...) are accepted and ignored, as Claude Code needs. Ranges are Anthropic's (temperature 0..1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from engine.sampling_params import MAX_STOP_STRINGS
from frontend.chat.protocol import MAX_MESSAGES, ShortStr, StopString

MAX_TOOLS = 1024
ToolName = Annotated[str, Meta(min_length=1, max_length=128)]


class TextBlock(msgspec.Struct, kw_only=True, tag="text", tag_field="type"):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class ImageBlock(msgspec.Struct, kw_only=True, tag="image", tag_field="type"):
    """Accepted by the parser so that the refusal names the block (ringserve's models read text only)."""

    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class DocumentBlock(msgspec.Struct, kw_only=True, tag="document", tag_field="type"):
    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(msgspec.Struct, kw_only=True, tag="tool_use", tag_field="type"):
    id: Annotated[str, Meta(min_length=1, max_length=256)]
    name: ToolName
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(msgspec.Struct, kw_only=True, tag="tool_result", tag_field="type"):
    tool_use_id: Annotated[str, Meta(min_length=1, max_length=256)]
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(msgspec.Struct, kw_only=True, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, kw_only=True, tag="redacted_thinking", tag_field="type"):
    data: str


ContentBlock = (TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                | RedactedThinkingBlock)


class Message(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], Meta(max_length=MAX_MESSAGES)]


class Tool(msgspec.Struct, kw_only=True):
    """A client tool ({name, input_schema}, type "custom" or none), or one of Anthropic's server tools
    (web_search_20250305, ...: a type and a name), which ringserve cannot run and leaves out."""

    name: ToolName
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: ShortStr | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool = False


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Meta(ge=0)] | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True):
    """Structured output (format) and effort; effort is accepted and ignored."""

    format: OutputFormat | None = None
    effort: ShortStr | None = None


class PromptRequest(msgspec.Struct, kw_only=True):
    """What count_tokens and create share: everything that shapes the prompt."""

    model: ShortStr
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    system: str | Annotated[list[TextBlock], Meta(max_length=MAX_MESSAGES)] | None = None
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class CountTokensRequest(PromptRequest, kw_only=True):
    pass


class MessagesRequest(PromptRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    seed: int | None = None                     # ringserve's extension (as chat's): reproducible sampling
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None
    service_tier: ShortStr | None = None
