"""The server with the real Qwen3 and Llama 3 tokenizers (../shared): chat prompts equal transformers'
apply_chat_template, and multi-byte text streams intact."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import shared_path
from tests.frontend.harness import serve_fake

SCRIPT = "Grüße 🙂🙃 from 東京, 서울 and Київ! "
MODELS = {"qwen3": "qwen3-0.6b", "llama3": "llama-3.2-1b"}
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Où est 東京? 🙂"},
]


@pytest.fixture(scope="module", params=sorted(MODELS))
def real(request):
    from transformers import AutoTokenizer

    tokenizer_dir = shared_path("models", "tokenizers", request.param)
    model_dir = shared_path("models", "configs", MODELS[request.param])
    server, fake = serve_fake(model_dir, engine_overrides={"tokenizer": str(tokenizer_dir),
                                                           "max_model_len": 4096}, script=SCRIPT)
    with server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        yield client, fake, AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_chat_prompt_equals_apply_chat_template(real):
    client, fake, tokenizer = real
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert fake.submitted[-1][1] == tokenizer(rendered, add_special_tokens=False).input_ids


def test_completion_prompt_equals_tokenizer_encode(real):
    client, fake, tokenizer = real
    client.completions.create(model="tiny", prompt="Où est 東京?", max_tokens=1)
    assert fake.submitted[-1][1] == tokenizer("Où est 東京?").input_ids


def test_multibyte_text_streams_intact(real):
    client, fake, _ = real
    n = len(fake.script)
    chunks = list(client.completions.create(model="tiny", prompt="x", max_tokens=n, temperature=0, stream=True))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == SCRIPT
    assert not any("\ufffd" in t for t in texts)


def test_stop_string_across_multibyte_tokens(real):
    client, fake, _ = real
    result = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
                                            stop=["🙃 from"])
    assert result.choices[0].message.content == "Grüße 🙂"
    assert result.choices[0].finish_reason == "stop"
