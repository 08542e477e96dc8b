"""Chat templates: chosen from --chat-template or the tokenizer, rendered in a sandboxed Jinja environment.

Templates come from model repositories, i.e. from strangers, so they run in Jinja's immutable sandbox with
the same helpers and whitespace rules that transformers' apply_chat_template gives them (trim_blocks,
lstrip_blocks, loop controls, a JSON filter that keeps non-ASCII, raise_exception, strftime_now), so a
prompt renders here exactly as it does there. Rendering is CPU work: callers run it off the event loop.
"""

from __future__ import annotations

import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from frontend.errors import ApiError, invalid
from frontend.chat.protocol import ChatMessage

# Appended to the final message to find where it ends in the rendered prompt (continue_final_message).
# The trailing space tells whether the template trimmed the message.
_CONTINUE_MARK = "RINGSERVE_CONTINUE_FINAL_MESSAGE "


class _GenerationTag(jinja2.ext.Extension):
    """Accepts `{% generation %}...{% endgeneration %}` (used to mark assistant tokens) and renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class TemplateOutputTooLong(ValueError):
    """A template's output passed the caller's bound; rendering stopped there (`length`: characters so far)."""

    def __init__(self, length: int) -> None:
        super().__init__(f"the chat template's output passed {length} characters")
        self.length = length


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


MAX_REPEAT_ITEMS = 1 << 24      # 'x' * n and [..] * n in a template: at most this many characters or items
MAX_POWER_EXPONENT = 10_000      # n ** k in a template: a huge k would compute for ever


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with the two operators that build unbounded values out of small request
    data (a number in chat_template_kwargs, say) bounded: repetition and integer powers. Jinja's own
    sandbox already bounds range() (OverflowError past 100,000 items)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and right > MAX_POWER_EXPONENT and isinstance(left, int) \
                and abs(left) > 1:
            raise OverflowError(f"the power's exponent {right} exceeds {MAX_POWER_EXPONENT}")
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if (isinstance(sequence, (str, list, tuple)) and isinstance(times, int)
                        and len(sequence) * times > MAX_REPEAT_ITEMS):
                    raise OverflowError(f"repeating a value would make more than {MAX_REPEAT_ITEMS} items")
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def load_chat_template_source(value: str) -> str:
    """--chat-template's value: the template itself when it contains Jinja markup, else a file to read."""
    if "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value):
        raise ValueError(f"chat template {value!r} is neither a Jinja template nor a readable file")
    with open(value, encoding="utf-8") as f:
        return f.read()


class ChatTemplate:
    """A compiled chat template plus the tokenizer's special tokens it may refer to (bos_token, ...)."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"the chat template does not compile: {e} (line {e.lineno})") from None
        self._special_tokens = dict(special_tokens or {})

    @classmethod
    def for_tokenizer(cls, tokenizer, override: str | None = None) -> ChatTemplate | None:
        """The template from --chat-template when given, else the tokenizer's; None when neither exists."""
        source = load_chat_template_source(override) if override else getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):     # several named templates: the default one serves chat
            source = source.get("default")
        if not source:
            return None
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        return cls(source, special)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               continue_final_message: bool = False, extra: dict | None = None,
               tools: list[dict] | None = None, max_chars: int | None = None) -> str:
        """The prompt text; template failures raise ApiError(400) with the template's message. Past
        `max_chars` characters of output, rendering stops with TemplateOutputTooLong: a template loop over
        request data (or over a range the sandbox allows) must not build gigabytes."""
        if continue_final_message:
            if add_generation_prompt:
                raise invalid("continue_final_message and add_generation_prompt cannot both be true",
                              "continue_final_message")
            final = messages[-1]
            if not isinstance(final.get("content"), str):
                raise invalid("continue_final_message needs a final message with text content", "messages")
            messages = [*messages[:-1], {**final, "content": final["content"] + _CONTINUE_MARK}]
        variables = {**self._special_tokens, **(extra or {}), "messages": messages, "tools": tools,
                     "documents": None, "add_generation_prompt": add_generation_prompt}
        try:
            text = self._render(variables, max_chars)
        except TemplateOutputTooLong:
            raise
        except jinja2.TemplateError as e:
            raise invalid(f"chat template error: {e}", "messages") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            raise invalid(f"the chat template failed on these messages: {type(e).__name__}: {e}",
                          "messages") from None
        if continue_final_message:
            mark = _CONTINUE_MARK.strip()
            at = text.rfind(mark)
            if at == -1:
                raise invalid("the chat template dropped the final message, so it cannot be continued",
                              "continue_final_message")
            # A template that trims messages also trimmed the final message's trailing space.
            text = text[:at] if text.startswith(_CONTINUE_MARK, at) else text[:at].rstrip()
        return text


    def _render(self, variables: dict, max_chars: int | None) -> str:
        if max_chars is None:
            return self._template.render(**variables)
        parts, length = [], 0
        for part in self._template.generate(**variables):
            length += len(part)
            if length > max_chars:
                raise TemplateOutputTooLong(length)
            parts.append(part)
        return "".join(parts)


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """Request messages as templates expect them (as vLLM normalises them): content parts flattened to
    text (text parts only); an assistant's null content as "" (Qwen3's template tests `'</think>' in
    content`); tool-call arguments as objects, not JSON text (Llama 3.1 and Mistral templates apply
    `tojson` to them); an earlier turn's `reasoning` under `reasoning_content`, the name templates read."""
    out = []
    for i, message in enumerate(messages):
        content = text_content(message.content, i)
        if content is None and message.role == "assistant":
            content = ""
        item = {"role": message.role, "content": content}
        for name in ("name", "tool_call_id"):
            value = getattr(message, name)
            if value is not None:
                item[name] = value
        if message.tool_calls is not None:
            item["tool_calls"] = [_template_tool_call(call, i, j) for j, call in enumerate(message.tool_calls)]
        reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
        if reasoning is not None:
            item["reasoning_content"] = reasoning
        out.append(item)
    return out


def _template_tool_call(call: dict, index: int, j: int) -> dict:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid("a tool call needs a function with a name", f"messages[{index}].tool_calls[{j}].function")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise invalid("tool call arguments must be JSON",
                          f"messages[{index}].tool_calls[{j}].function.arguments") from None
    return {**call, "function": {**function, "arguments": arguments}}


def text_content(content: str | list[dict] | None, index: int) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise ApiError(400, f"content part type {kind!r} is not supported; only 'text' parts are",
                           f"messages[{index}].content[{j}].type")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid("a text content part needs a string 'text'", f"messages[{index}].content[{j}].text")
        texts.append(text)
    return "\n".join(texts)
