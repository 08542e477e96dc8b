"""OpenAI Responses requests as chat requests: the input half of the /v1/responses layer over chat.

instructions -> a system message (not carried over by previous_response_id, as in OpenAI's API); a stored
previous response's conversation comes next, then `input`: a string is a user message; message items keep
their role (developer -> system); function_call items become the assistant's tool_calls (joined to the
assistant message before them); function_call_output items become tool messages; reasoning items become
the next assistant message's reasoning_content. tools -> chat function tools (OpenAI's built-in server tools,
web_search and the like, are left out: ringserve cannot run them; other client tool kinds are refused, as
ringserve cannot write their calls); text.format -> response_format; reasoning.effort -> the template's
enable_thinking and reasoning_effort.
"""

from __future__ import annotations

from frontend.errors import invalid
from frontend.chat.protocol import ChatCompletionRequest, ChatMessage, JsonSchemaFormat, ResponseFormat
from frontend.responses.protocol import (
    InputText,
    OutputText,
    ReasoningText,
    Refusal,
    ResponsesRequest,
)

SERVER_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation", "mcp")
# Names of chat fields in this API, for error messages.
FIELD_NAMES = {"max_tokens": "max_output_tokens", "response_format.json_schema": "text.format",
               "response_format": "text.format"}


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The chat messages that `req.input` adds to the conversation."""
    if isinstance(req.input, str):
        return [ChatMessage(role="user", content=req.input)]
    if not req.input:
        raise invalid("input must not be empty", "input")
    out: list[ChatMessage] = []
    reasoning: list[str] = []
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if item.type == "message":
            role = _required(item.role, f"{where}.role")
            content = _text(_required(item.content, f"{where}.content"), f"{where}.content")
            message = ChatMessage(role="system" if role == "developer" else role, content=content)
            if role == "assistant" and reasoning:
                message.reasoning_content, reasoning = "\n".join(reasoning), []
            out.append(message)
        elif item.type == "function_call":
            call = {"id": _required(item.call_id, f"{where}.call_id"), "type": "function",
                    "function": {"name": _required(item.name, f"{where}.name"),
                                 "arguments": _required(item.arguments, f"{where}.arguments")}}
            if not out or out[-1].role != "assistant":
                out.append(ChatMessage(role="assistant", content=""))
            last = out[-1]
            last.tool_calls = [*(last.tool_calls or ()), call]
            if reasoning:
                last.reasoning_content, reasoning = "\n".join(reasoning), []
        elif item.type == "function_call_output":
            output = _text(_required(item.output, f"{where}.output"), f"{where}.output")
            out.append(ChatMessage(role="tool", tool_call_id=_required(item.call_id, f"{where}.call_id"),
                                   content=output))
        else:   # reasoning: its text parts, else its summary
            parts = [p.text for p in item.content or () if isinstance(p, ReasoningText)]
            reasoning += parts or [s.text for s in item.summary or ()]
    return out


def to_chat_request(req: ResponsesRequest, history: list[ChatMessage],
                    new_messages: list[ChatMessage]) -> ChatCompletionRequest:
    messages = list(history) + new_messages
    if req.instructions:
        messages.insert(0, ChatMessage(role="system", content=req.instructions))
    if not messages:
        raise invalid("input must not be empty", "input")
    functions = _function_tools(req)
    tools = tool_choice = None
    if functions:
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description or "",
            "parameters": t.parameters if t.parameters is not None else {"type": "object", "properties": {}},
            **({"strict": t.strict} if t.strict is not None else {})}} for t in functions]
    if req.tool_choice is not None:
        tool_choice = req.tool_choice
        if not isinstance(tool_choice, str):
            if not any(t.name == tool_choice.name for t in functions):
                raise invalid(f"tool_choice names {tool_choice.name!r}, which is not among the function tools",
                              "tool_choice.name")
            tool_choice = {"type": "function", "function": {"name": tool_choice.name}}
        elif tool_choice != "none" and not functions:
            raise invalid(f"tool_choice {tool_choice!r} needs function tools", "tool_choice")
    kwargs = None
    if req.reasoning is not None and req.reasoning.effort is not None:
        kwargs = {"enable_thinking": req.reasoning.effort != "none", "reasoning_effort": req.reasoning.effort}
    return ChatCompletionRequest(
        messages=messages, tools=tools, tool_choice=tool_choice, parallel_tool_calls=req.parallel_tool_calls,
        response_format=_response_format(req), chat_template_kwargs=kwargs, max_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed, stop=req.stop,
        stream=req.stream,
    )


def _function_tools(req: ResponsesRequest) -> list:
    functions = []
    for i, tool in enumerate(req.tools or ()):
        if tool.type in SERVER_TOOLS:
            continue
        if tool.type != "function":
            raise invalid(f"tool type {tool.type!r} is not supported: only function tools (OpenAI's built-in "
                          f"tools, {', '.join(SERVER_TOOLS)}, are left out)", f"tools[{i}].type")
        _required(tool.name, f"tools[{i}].name")
        functions.append(tool)
    return functions


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    schema = _required(fmt.schema, "text.format.schema")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=fmt.name or "output", schema=schema, strict=fmt.strict, description=fmt.description))


def _required(value, param: str):
    if value is None:
        raise invalid(f"{param} is required for this item type", param)
    return value


def _text(content, where: str) -> str:
    """A message's or an output's text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, (InputText, OutputText)):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        else:
            raise invalid(f"content part type {part.__struct_config__.tag!r} is not supported: the model reads "
                          "text only", f"{where}[{j}].type")
    return "\n".join(texts)
