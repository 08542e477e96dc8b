"""frontend/chat/tool_choice: vLLM's checks of tools and tool_choice (400 naming the field), and the grammars
of forced calls: each accepts the calls its own parser reads (arguments valid for the tool's parameters)
and refuses anything else."""

from __future__ import annotations

import json

import pytest

from frontend.errors import ApiError
from frontend.chat.tool_choice import MAX_TOOLS, plan_tools, structural_tag

xgr = pytest.importorskip("xgrammar")

TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["tz"],
    "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
TOOLS = [TIME, ADD]
NAMED_ADD = {"type": "function", "function": {"name": "add"}}


def refused(param: str, *args, **kwargs) -> str:
    with pytest.raises(ApiError) as info:
        plan_tools(*args, **kwargs)
    assert info.value.status == 400 and info.value.param == param, (info.value.param, info.value.message)
    return info.value.message


def test_refusals_name_the_field():
    assert "`tools` must be set" in refused("tool_choice", None, "required", None)
    refused("tools", [], "none", None)
    refused("tools", [TIME] * (MAX_TOOLS + 1), "none", None)
    assert "has not been passed" in refused("tool_choice", TOOLS, {"type": "function", "function": {"name": "x"}},
                                            None)
    assert "--enable-auto-tool-choice" in refused("tool_choice", TOOLS, "auto", None, tool_call_parser="hermes")
    assert "--enable-auto-tool-choice" in refused("tool_choice", TOOLS, None, None, enable_auto_tool_choice=True)
    refused("tool_choice", TOOLS, "sometimes", None)
    refused("tools[0].function.name", [{"type": "function", "function": {"name": "bad name!"}}], "none", None)
    refused("tools[0].function.name", [{"type": "function", "function": {"name": "x" * 65}}], "none", None)
    refused("tools[1].function.name", [TIME, TIME], "none", None)
    refused("tools[0].type", [{"type": "retrieval"}], "none", None)
    refused("tools[0].function.parameters", [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
            "none", None)


def test_none_still_renders_tools_unless_excluded():
    plan = plan_tools(TOOLS, "none", None)
    assert plan.mode == "none" and plan.template_tools == TOOLS and plan.parser is None
    assert plan_tools(TOOLS, "none", None, exclude_tools_when_tool_choice_none=True).template_tools is None
    assert plan_tools(None, "none", None) is None and plan_tools(None, None, None) is None


def test_auto_reads_with_the_parser_and_forces_nothing():
    plan = plan_tools(TOOLS, None, False, tool_call_parser="llama3_json", enable_auto_tool_choice=True)
    assert plan.mode == "auto" and plan.parser.name == "llama3_json" and plan.structural_tag is None
    assert not plan.parallel_tool_calls


def accepts(plan, text: str, **reasoning) -> bool:
    tag = structural_tag(plan.structural_tag, reasoning_open=reasoning.get("open", False),
                         reasoning_optional=reasoning.get("optional", False))
    return xgr.testing._is_grammar_accept_string(xgr.Grammar.from_structural_tag(json.dumps(tag)), text)


HERMES_TIME = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
HERMES_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": -2}}\n</tool_call>'

# parser -> (two valid calls joined as the format joins them, one valid call, one with invalid arguments)
FORMATS = {
    "hermes": (HERMES_TIME + "\n" + HERMES_ADD, HERMES_ADD,
               '<tool_call>\n{"name": "add", "arguments": {"a": "one", "b": 2}}\n</tool_call>'),
    "llama3_json": ('{"name": "get_time", "parameters": {"tz": "CET"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}',
                    '{"name": "add", "parameters": {"a": 1, "b": 2}}', '{"name": "add", "parameters": {"a": 1}}'),
    "mistral": ('[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}}, {"name": "add", "arguments": '
                '{"a": 1, "b": 2}}]', '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
                '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}]'),
    None: ('[{"name": "get_time", "parameters": {"tz": "UTC"}}, {"name": "add", "parameters": {"a": 1, "b": 2}}]',
           '[{"name": "add", "parameters": {"a": 1, "b": 2}}]', '[{"name": "add", "parameters": {"b": 2}}]'),
}


@pytest.mark.parametrize("parser", list(FORMATS))
def test_required_grammar_accepts_what_the_parser_reads(parser):
    two, one, invalid = FORMATS[parser]
    plan = plan_tools(TOOLS, "required", None, tool_call_parser=parser)
    assert accepts(plan, two) and accepts(plan, one)
    assert not accepts(plan, invalid) and not accepts(plan, "") and not accepts(plan, "Sure! " + one)
    calls = plan.parser.extract(two).tool_calls
    assert [c.name for c in calls] == ["get_time", "add"]
    assert json.loads(calls[1].arguments) in ({"a": 1, "b": -2}, {"a": 1, "b": 2})
    single = plan_tools(TOOLS, "required", False, tool_call_parser=parser)
    assert accepts(single, one) and not accepts(single, two)


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral"])
def test_named_grammar_allows_only_that_function_once(parser):
    two, one, invalid = FORMATS[parser]
    plan = plan_tools(TOOLS, NAMED_ADD, None, tool_call_parser=parser)
    assert plan.mode == "named" and accepts(plan, one)
    assert not accepts(plan, two) and not accepts(plan, invalid)


@pytest.mark.parametrize("parser", [None, "pythonic"])
def test_named_without_a_native_format_writes_the_arguments_alone(parser):
    plan = plan_tools(TOOLS, NAMED_ADD, None, tool_call_parser=parser)
    assert accepts(plan, '{"a": 1, "b": 2}') and not accepts(plan, '{"a": 1}')
    calls = plan.parser.extract('{"a": 1, "b": 2}').tool_calls
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1, "b": 2}')]


def test_forced_calls_come_after_the_reasoning():
    plan = plan_tools(TOOLS, "required", None, tool_call_parser="hermes")
    assert accepts(plan, "thinking about it</think>\n\n" + HERMES_TIME, open=True)
    assert not accepts(plan, HERMES_TIME, open=True)                      # the prompt opened the block
    assert accepts(plan, "<think>hm</think>\n\n" + HERMES_TIME, optional=True)
    assert accepts(plan, HERMES_TIME, optional=True)
    assert not accepts(plan, "<think>hm</think>\n\n" + HERMES_TIME)        # no reasoning parser: no block


def test_whitespace_inside_forced_arguments_can_be_bounded():
    loose = '<tool_call>\n{"name": "add", "arguments": {"a":   1, "b": 2}}\n</tool_call>'
    assert accepts(plan_tools(TOOLS, NAMED_ADD, None, tool_call_parser="hermes"), loose)
    tight = plan_tools(TOOLS, NAMED_ADD, None, tool_call_parser="hermes", max_whitespace_cnt=1)
    assert not accepts(tight, loose) and accepts(tight, FORMATS["hermes"][1])
