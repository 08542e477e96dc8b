"""frontend/chat/template.py: renders exactly as transformers' apply_chat_template; sandboxed; text parts only."""

from __future__ import annotations

import pytest

from frontend.chat.template import ChatTemplate, load_chat_template_source, template_messages
from frontend.errors import ApiError
from frontend.chat.protocol import ChatMessage
from tests.conftest import shared_path

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour. 🙂"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another, in 日本語?"},
]


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_path("models", "tokenizers", request.param)))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_transformers(tokenizer, add_generation_prompt):
    template = ChatTemplate.for_tokenizer(tokenizer)
    ours = template.render(CONVERSATION, add_generation_prompt=add_generation_prompt)
    theirs = tokenizer.apply_chat_template(CONVERSATION, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_continue_final_message_equals_transformers(tokenizer):
    conversation = [*CONVERSATION, {"role": "assistant", "content": "Green, or in Japanese "}]
    ours = ChatTemplate.for_tokenizer(tokenizer).render(conversation, add_generation_prompt=False,
                                                        continue_final_message=True)
    theirs = tokenizer.apply_chat_template(conversation, tokenize=False, continue_final_message=True)
    assert ours == theirs
    assert ours.rstrip().endswith("Green, or in Japanese")


def test_template_kwargs_reach_the_template():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("models", "tokenizers", "qwen3")))
    template = ChatTemplate.for_tokenizer(tokenizer)
    ours = template.render(CONVERSATION, extra={"enable_thinking": False})
    assert ours == tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True,
                                                 enable_thinking=False)
    assert ours != template.render(CONVERSATION)


def test_special_tokens_are_visible_to_the_template():
    template = ChatTemplate("{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}",
                            {"bos_token": "<s>", "eos_token": "</s>"})
    assert template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False) == "<s>hi</s>"


def test_sandbox_refuses_python_internals():
    template = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ApiError) as info:
        template.render([{"role": "user", "content": "x"}])
    assert info.value.status == 400


def test_raise_exception_becomes_a_400_with_the_templates_message():
    template = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}"
                            "{% endif %}ok")
    with pytest.raises(ApiError) as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert "roles must alternate" in info.value.message and info.value.param == "messages"


def test_generation_tag_renders_its_body():
    template = ChatTemplate("{% for m in messages %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endfor %}")
    assert template.render([{"role": "assistant", "content": "a"}], add_generation_prompt=False) == "[a]"


def test_syntax_error_is_a_clear_value_error():
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_text_parts_are_joined_and_other_parts_refused():
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert template_messages([parts]) == [{"role": "user", "content": "a\nb"}]
    image = ChatMessage(role="user", content=[{"type": "text", "text": "a"},
                                              {"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(ApiError) as info:
        template_messages([ChatMessage(role="system", content="s"), image])
    assert info.value.status == 400 and info.value.param == "messages[1].content[1].type"


def test_template_source_is_inline_or_a_file(tmp_path):
    assert load_chat_template_source("{{ messages }}") == "{{ messages }}"
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template_source(str(path)) == path.read_text()
    with pytest.raises(ValueError, match="neither a Jinja template nor a readable file"):
        load_chat_template_source(str(tmp_path / "missing.jinja"))


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "名前"}}}}}]


def _tool_conversation(arguments):
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in 東京?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 20}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "20 degrees.", "reasoning": "read the tool output"},
        {"role": "user", "content": "thanks"},
    ]


@pytest.mark.parametrize("arguments", ['{"city": "東京"}', {"city": "東京"}])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_tools_and_tool_turns_render_as_transformers(arguments, kwargs):
    """Qwen3 with tools: requests normalised as vLLM does (null content -> "", JSON-text arguments -> objects,
    reasoning -> reasoning_content) render exactly as transformers renders the normalised messages."""
    import msgspec
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("models", "tokenizers", "qwen3")))
    request = msgspec.convert(_tool_conversation(arguments), list[ChatMessage])
    ours = ChatTemplate.for_tokenizer(tokenizer).render(template_messages(request), tools=TOOLS, extra=kwargs)
    normalised = _tool_conversation({"city": "東京"})
    normalised[2]["content"] = ""
    normalised[5]["reasoning_content"] = normalised[5].pop("reasoning")
    theirs = tokenizer.apply_chat_template(normalised, tools=TOOLS, tokenize=False, add_generation_prompt=True,
                                           **kwargs)
    assert ours == theirs
    assert "<tools>" in ours and '"arguments": {"city": "東京"}' in ours and "<tool_response>" in ours


def test_our_llama3_json_template_renders_as_transformers():
    import msgspec
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("models", "tokenizers", "llama3")))
    source = load_chat_template_source("frontend/chat_templates/llama3_json.jinja")
    request = msgspec.convert(_tool_conversation('{"city": "東京"}'), list[ChatMessage])
    ours = ChatTemplate.for_tokenizer(tokenizer, source).render(template_messages(request), tools=TOOLS)
    normalised = _tool_conversation({"city": "東京"})
    normalised[2]["content"] = ""
    theirs = tokenizer.apply_chat_template(normalised, tools=TOOLS, chat_template=source, tokenize=False,
                                           add_generation_prompt=True)
    assert ours == theirs
    assert '{"name": "get_weather", "parameters": {"city": "東京"}}; {"name": "get_weather"' in ours


def test_bad_tool_call_arguments_are_a_400():
    message = ChatMessage(role="assistant", tool_calls=[{"function": {"name": "f", "arguments": "{not json"}}])
    with pytest.raises(ApiError) as info:
        template_messages([message])
    assert info.value.param == "messages[0].tool_calls[0].function.arguments"
