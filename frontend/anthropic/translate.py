"""Anthropic Messages requests as chat requests: the input half of the /v1/messages layer over chat.

system -> a system message; user text -> user messages; tool_result blocks -> tool messages (placed before
the user's own text, right after the assistant turn that called the tools, as chat templates expect);
assistant tool_use -> tool_calls; thinking -> reasoning_content; tools -> OpenAI function tools;
tool_choice auto/any/tool/none -> auto/required/named/none; thinking enabled/disabled -> the template's
enable_thinking (and DeepSeek's and Granite's `thinking`); output_config.format -> a json_schema
response_format (structured outputs). A final assistant message is a prefill: the reply continues it, as in
Anthropic's API. Server tools (web search, ...) are left out of the prompt: ringserve cannot run them,
and refusing them would fail clients (such as Claude Code) that send them whatever the backend.
"""

from __future__ import annotations

import orjson

from frontend.anthropic.protocol import (
    DocumentBlock,
    ImageBlock,
    Message,
    PromptRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from frontend.errors import invalid
from frontend.chat.protocol import ChatCompletionRequest, ChatMessage

# Names of chat fields in this API, for error messages.
FIELD_NAMES = {"stop": "stop_sequences", "max_tokens": "max_tokens", "top_k": "top_k",
               "response_format.json_schema": "output_config.format", "response_format": "output_config.format"}


def to_chat_request(req: PromptRequest, **sampling) -> ChatCompletionRequest:
    """The chat request that `req` means; `sampling` carries the create-only fields (max_tokens, ...)."""
    messages = []
    if req.system:
        messages.append(ChatMessage(role="system", content=_system_text(req.system)))
    for i, message in enumerate(req.messages):
        messages += _chat_messages(message, i)
    tools = tool_choice = parallel = kwargs = None
    client_tools = _client_tools(req)
    if client_tools:
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                    "parameters": t.input_schema}} for t in client_tools]
    if req.tool_choice is not None:
        tool_choice, parallel = _tool_choice(req, client_tools)
    if req.thinking is not None and req.thinking.type in ("enabled", "disabled"):
        enabled = req.thinking.type == "enabled"
        kwargs = {"enable_thinking": enabled, "thinking": enabled}
    prefill = req.messages[-1].role == "assistant"
    return ChatCompletionRequest(messages=messages, tools=tools, tool_choice=tool_choice,
                                 parallel_tool_calls=parallel, chat_template_kwargs=kwargs,
                                 add_generation_prompt=not prefill, continue_final_message=prefill, **sampling)


def _client_tools(req: PromptRequest) -> list:
    tools = []
    for i, tool in enumerate(req.tools or ()):
        if tool.type not in (None, "custom"):
            continue                              # a server tool
        if tool.input_schema is None:
            raise invalid("a client tool needs an input_schema", f"tools[{i}].input_schema")
        tools.append(tool)
    return tools


def _system_text(system: str | list[TextBlock]) -> str:
    return system if isinstance(system, str) else "\n".join(block.text for block in system)


def _tool_choice(req: PromptRequest, tools: list) -> tuple[str | dict, bool | None]:
    choice = req.tool_choice
    if choice.type == "tool":
        if not choice.name:
            raise invalid("tool_choice of type 'tool' needs the tool's name", "tool_choice.name")
        if not any(tool.name == choice.name for tool in tools):
            raise invalid(f"tool_choice names {choice.name!r}, which is not among the client tools",
                          "tool_choice.name")
        chat_choice = {"type": "function", "function": {"name": choice.name}}
    else:
        chat_choice = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.type != "none" and not tools:
        raise invalid(f"tool_choice {choice.type!r} needs tools", "tool_choice")
    return chat_choice, (False if choice.disable_parallel_tool_use else None)


def _chat_messages(message: Message, index: int) -> list[ChatMessage]:
    """One Anthropic message as chat messages (a user message with tool results becomes several)."""
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    texts, tool_calls, tool_messages, thinking = [], [], [], []
    for j, block in enumerate(message.content):
        where = f"messages[{index}].content[{j}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, (ImageBlock, DocumentBlock)):
            raise invalid(f"{type(block).__name__[:-5].lower()} blocks are not supported: the model reads text "
                          "only", f"{where}.type")
        elif isinstance(block, ToolUseBlock):
            _only(message.role, "assistant", block, where)
            tool_calls.append({"id": block.id, "type": "function",
                               "function": {"name": block.name, "arguments": orjson.dumps(block.input).decode()}})
        elif isinstance(block, ToolResultBlock):
            _only(message.role, "user", block, where)
            tool_messages.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id,
                                             content=_tool_result_text(block, where)))
        elif isinstance(block, ThinkingBlock):
            _only(message.role, "assistant", block, where)
            thinking.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            pass                   # encrypted reasoning of another model: nothing this one can read
    out = list(tool_messages)
    if texts or not tool_messages:
        out.append(ChatMessage(role=message.role, content="\n".join(texts), tool_calls=tool_calls or None,
                               reasoning_content="\n".join(thinking) or None))
    return out


def _only(role: str, expected: str, block, where: str) -> None:
    if role != expected:
        raise invalid(f"{block.__struct_config__.tag} blocks belong in {expected} messages", f"{where}.type")


def _tool_result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    texts = []
    for k, part in enumerate(block.content):
        if not isinstance(part, TextBlock):
            raise invalid("tool results may hold text blocks only: the model reads text only",
                          f"{where}.content[{k}].type")
        texts.append(part.text)
    return "\n".join(texts)
