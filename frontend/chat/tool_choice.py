"""A chat request's `tools` and `tool_choice`, checked and turned into a ToolPlan: what the chat template
gets, how the output is read, and (for `required` and a named function) the grammar that forces the call.

The checks and messages are vLLM's (400 naming the field): tool_choice without tools, `tools: []`, more than
128 tools, names outside `^[a-zA-Z0-9_-]{1,64}$` or repeated, parameters that are not a JSON schema object,
an unknown named tool, `auto` without --enable-auto-tool-choice and --tool-call-parser.

Forced calls are written in the model's own format so the same parser reads them as it reads `auto`
output: an xgrammar structural tag (hermes: `<tool_call>\\n{"name": N, "arguments": ` + the tool's
parameters schema + `}\\n</tool_call>`; llama3_json: `{"name": N, "parameters": ...}` joined by `; `;
mistral: `[TOOL_CALLS][...]`). Formats without one (pythonic, or no parser) use vLLM's older JSON forms:
`required` writes `[{"name": N, "parameters": {...}}, ...]` and a named function writes its arguments
object alone. With a reasoning parser whose prompt leaves the model thinking, the grammar starts with the
think block, so the constraint applies after the reasoning ends.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from engine.sampling_params import CONSTRAINT_FIELDS, StructuredOutputsParams
from engine.structured_spec import validate
from frontend.errors import invalid
from frontend.chat.reasoning.base import REASONING, START, ReasoningParser
from frontend.chat.tool_parsers import TOOL_PARSERS, ToolParser, get_tool_parser
from frontend.chat.tool_parsers.forced import ArgumentsOnlyToolParser, JsonArrayToolParser

MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
ANY_OBJECT: dict = {"type": "object"}
# the call formats of the parsers that have one: (list opening, call begin with {name}, call end, separator,
# list closing)
NATIVE_FORMATS: dict[str, tuple[str, str, str, str, str]] = {
    "hermes": ("", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>", "\n", ""),
    "llama3_json": ("", '{{"name": "{name}", "parameters": ', "}", "; ", ""),
    "mistral": ("[TOOL_CALLS][", '{{"name": "{name}", "arguments": ', "}", ", ", "]"),
}
THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ToolPlan:
    mode: str                                # "none" | "auto" | "required" | "named"
    template_tools: list[dict] | None        # what the chat template renders
    tools: dict[str, dict]                   # name -> the tool's "function" object
    named: str | None = None                 # the forced function's name
    parser: ToolParser | None = None         # reads the output (None: plain content)
    structural_tag: dict | None = None       # the grammar forcing the call (required, named)
    parallel_tool_calls: bool = True

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")


def plan_tools(tools: list[dict[str, Any]] | None, tool_choice: str | dict | None,
               parallel_tool_calls: bool | None, *, tool_call_parser: str | None = None,
               enable_auto_tool_choice: bool = False, exclude_tools_when_tool_choice_none: bool = False,
               max_whitespace_cnt: int | None = None) -> ToolPlan | None:
    """The plan for a request, or None when it has no tools (and no tool_choice other than "none").
    max_whitespace_cnt bounds runs of whitespace inside forced arguments (None: any)."""
    if tools is None:
        if tool_choice is not None and tool_choice != "none":
            raise invalid("When using `tool_choice`, `tools` must be set.", "tool_choice")
        return None
    functions = check_tools(tools)
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    mode, named = _mode(tool_choice, functions)
    if mode == "none":
        return ToolPlan("none", None if exclude_tools_when_tool_choice_none else tools, functions,
                        parallel_tool_calls=parallel)
    if mode == "auto":
        if not (enable_auto_tool_choice and tool_call_parser):
            raise invalid('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                          "tool_choice")
        return ToolPlan("auto", tools, functions, parser=get_tool_parser(tool_call_parser),
                        parallel_tool_calls=parallel)
    forced = [functions[named]] if named else list(functions.values())
    if tool_call_parser in NATIVE_FORMATS:
        parser = get_tool_parser(tool_call_parser)
        tag = native_call_format(tool_call_parser, forced, parallel and not named, max_whitespace_cnt)
    else:
        schema = _parameters(functions[named]) if named else json_array_schema(forced, parallel)
        parser = ArgumentsOnlyToolParser(named) if named else JsonArrayToolParser()
        tag = _json_format(schema, max_whitespace_cnt)
    return ToolPlan(mode, tools, functions, named, parser, tag, parallel)


def check_tools(tools: list[dict[str, Any]]) -> dict[str, dict]:
    """name -> function object, after vLLM's checks (each failure a 400 naming the tool's field)."""
    if not tools:
        raise invalid("`tools` must not be empty; leave it out when there are none", "tools")
    if len(tools) > MAX_TOOLS:
        raise invalid(f"at most {MAX_TOOLS} tools may be given, got {len(tools)}", "tools")
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid("each tool must be {\"type\": \"function\", \"function\": {...}}", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise invalid("a tool needs a \"function\" object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise invalid("a function name must match ^[a-zA-Z0-9_-]{1,64}$", f"{where}.function.name")
        if name in functions:
            raise invalid(f"the function name {name!r} is given twice", f"{where}.function.name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid("a function description must be a string", f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid("a function's parameters must be a JSON schema object", f"{where}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid("strict must be a boolean", f"{where}.function.strict")
        functions[name] = function
    return functions


def _mode(tool_choice: str | dict | None, functions: dict[str, dict]) -> tuple[str, str | None]:
    if tool_choice is None or tool_choice == "auto":
        return "auto", None
    if tool_choice in ("none", "required"):
        return tool_choice, None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise invalid("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                          "tool_choice.function.name")
        if name not in functions:
            raise invalid(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
        return "named", name
    raise invalid("tool_choice must be \"none\", \"auto\", \"required\" or "
                  "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


def _parameters(function: dict) -> dict:
    return function.get("parameters") or ANY_OBJECT


def _json_format(schema: dict, max_whitespace_cnt: int | None) -> dict:
    fmt = {"type": "json_schema", "json_schema": schema}
    if max_whitespace_cnt is not None:
        fmt["max_whitespace_cnt"] = max_whitespace_cnt
    return fmt


def native_call_format(parser_name: str, functions: list[dict], parallel: bool,
                       max_whitespace_cnt: int | None = None) -> dict:
    """The structural-tag format of one or more calls in a parser's own format (at least one call; at most
    one when not parallel)."""
    opening, begin, end, separator, closing = NATIVE_FORMATS[parser_name]
    tags = [{"type": "tag", "begin": begin.format(name=f["name"]),
             "content": _json_format(_parameters(f), max_whitespace_cnt), "end": end} for f in functions]
    calls = {"type": "tags_with_separator", "tags": tags, "separator": separator, "at_least_one": True,
             "stop_after_first": not parallel}
    elements = [e for e in ({"type": "const_string", "value": opening} if opening else None, calls,
                            {"type": "const_string", "value": closing} if closing else None) if e]
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def json_array_schema(functions: list[dict], parallel: bool) -> dict:
    """vLLM's `required` schema for formats without a native one: a list of {name, parameters}."""
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                                "parameters": _parameters(f)},
              "required": ["name", "parameters"]} for f in functions]
    schema: dict = {"type": "array", "minItems": 1, "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def structural_tag(call_format: dict, *, reasoning_open: bool, reasoning_optional: bool) -> dict:
    """The whole structural tag: the call format, after a think block when the model is still to reason
    (reasoning_open: the prompt opened it; reasoning_optional: the model may open one itself)."""
    if reasoning_open or reasoning_optional:
        think = {"type": "tag", "begin": "" if reasoning_open else THINK_START,
                 "content": {"type": "any_text", "excludes": [THINK_END]}, "end": THINK_END}
        block: dict = {"type": "sequence", "elements": [think, {"type": "regex", "pattern": r"\n{0,2}"}]}
        if not reasoning_open:
            block = {"type": "optional", "content": block}
        call_format = {"type": "sequence", "elements": [block, call_format]}
    return {"type": "structural_tag", "format": call_format}


async def forced_call_constraint(req, plan: ToolPlan, reasoning: ReasoningParser | None,
                                 reasoning_state: int) -> StructuredOutputsParams:
    """The constraint of a required or named call (a request with tools, tool_choice and maybe
    structured_outputs options), checked by the grammar backend off the event loop.

    Another constraint on the same request is refused, as vLLM refuses a named tool with
    structured_outputs; the forced tools' parameters get structured outputs' own checks (400 naming the
    tool), which `auto` and `none` skip: there the schemas are only shown to the model."""
    other = _other_constraint(req)
    if other is not None:
        raise invalid(f"tool_choice {'required' if plan.mode == 'required' else 'naming a function'} forces "
                      f"the output, so it cannot be combined with {other}", "tool_choice")
    reasoning_open = reasoning is not None and (
        reasoning_state == REASONING or (reasoning_state == START and reasoning.reasoning_without_start))
    reasoning_optional = reasoning is not None and reasoning_state == START and not reasoning.reasoning_without_start
    tag = structural_tag(plan.structural_tag, reasoning_open=reasoning_open, reasoning_optional=reasoning_optional)
    forced = [plan.named] if plan.named else list(plan.tools)
    indexes = {tool["function"]["name"]: i for i, tool in enumerate(req.tools)}

    def check() -> StructuredOutputsParams:
        for name in forced:
            param = f"tools[{indexes[name]}].function.parameters"
            try:
                validate(StructuredOutputsParams(json=_parameters(plan.tools[name])))
            except ValueError as e:
                message = str(e).replace("structured_outputs.json", param)
                raise invalid(f"{message} (tool {name!r})", param) from None
        constraint = StructuredOutputsParams(structural_tag=json.dumps(tag, ensure_ascii=False))
        try:
            validate(constraint)
        except ValueError as e:
            raise invalid(str(e).replace("structured_outputs.structural_tag", "the forced tool call's grammar"),
                          "tool_choice") from None
        return constraint

    return await asyncio.to_thread(check)


def _other_constraint(req) -> str | None:
    """The request field of a constraint other than the tool call's, if any."""
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type != "text":
        return "response_format"
    so = getattr(req, "structured_outputs", None)
    if so is not None and any(getattr(so, name) not in (None, False) for name in CONSTRAINT_FIELDS):
        return "structured_outputs"
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if getattr(req, name, None) is not None:
            return name
    return None


__all__ = ["MAX_TOOLS", "NATIVE_FORMATS", "TOOL_NAME", "TOOL_PARSERS", "ToolPlan", "check_tools",
           "forced_call_constraint", "json_array_schema", "native_call_format", "plan_tools", "structural_tag"]
