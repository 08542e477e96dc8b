"""Greedy generations through the whole engine equal Hugging Face transformers', token for token (fp32).

Each test starts the real multi-process engine (frontend client -> scheduler process -> executor
process(es) over the shm rings) on a tiny random-weight model saved with save_pretrained, and compares
against `model.generate(do_sample=False)` on the same weights: plain, with chunked prefill forced, with
prefix-cache hits, under preemption, with tensor parallelism over gloo, and in-process.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.hf_models import ARCHITECTURES, load_hf_model, tiny_model_fixture  # noqa: F401

MAX_TOKENS = 32
MAX_LEN = 512
BLOCK_BYTES_FP32 = 2 * 2 * 16 * 2 * 16 * 4     # layers * (k, v) * block_size * kv heads * head_dim * 4 B


def _model(tiny_model, arch: str):
    return tiny_model(arch, max_position_embeddings=MAX_LEN)


def _prompts(seed: int, lengths=(1, 7, 16, 17, 60, 129, 200, 300)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(n)] for n in lengths]


_HF_CACHE: dict = {}


def hf_greedy(path, prompts: list[list[int]], max_tokens: int = MAX_TOKENS):
    """(tokens, per-step log_softmax rows) for each prompt, generated one at a time (no padding)."""
    key = (str(path), tuple(map(tuple, prompts)), max_tokens)
    if key not in _HF_CACHE:
        hf = load_hf_model(path)
        hf.generation_config.eos_token_id = None     # like ignore_eos: EOS neither stops nor is suppressed
        results = []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                # an explicit mask: otherwise generate() treats prompt tokens equal to pad_token_id as padding
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  do_sample=False, output_logits=True,
                                  return_dict_in_generate=True, pad_token_id=0)
                tokens = out.sequences[0, len(p):].tolist()
                logprobs = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
                results.append((tokens, logprobs))
        _HF_CACHE[key] = results
    return _HF_CACHE[key]


def greedy(max_tokens: int = MAX_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def generate_tokens(llm: LLM, prompts, params=None) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params or greedy(), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_matches_transformers(tiny_model, arch):
    path = _model(tiny_model, arch)
    prompts = _prompts(1)
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, seed=0) as llm:
        assert generate_tokens(llm, prompts) == expected


def test_chunked_prefill_matches_transformers(tiny_model):
    path = _model(tiny_model, "LlamaForCausalLM")
    prompts = _prompts(2)
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_batched_tokens=64, max_num_seqs=8) as llm:
        assert generate_tokens(llm, prompts) == expected


def test_prefix_cache_hits_match_transformers(tiny_model):
    path = _model(tiny_model, "Qwen3ForCausalLM")
    rng = random.Random(3)
    prefix = [rng.randrange(512) for _ in range(200)]
    first = [prefix + [rng.randrange(512) for _ in range(n)] for n in (5, 40)]
    second = [prefix + [rng.randrange(512) for _ in range(n)] for n in (1, 17, 33)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN) as llm:
        assert generate_tokens(llm, first) == [t for t, _ in hf_greedy(path, first)]
        outputs = llm.generate([{"prompt_token_ids": p} for p in second], greedy(), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [t for t, _ in hf_greedy(path, second)]
    # the 200-token prefix is 12 full blocks of 16: every second-round request hits them
    assert all(o.num_cached_tokens >= 192 for o in outputs)


def test_preemption_matches_transformers(tiny_model):
    path = _model(tiny_model, "Qwen2ForCausalLM")
    prompts = _prompts(4)
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    # 40 blocks of 16 tokens: enough for any one request, far too few for all eight at once
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, kv_cache_memory=40 * BLOCK_BYTES_FP32) as llm:
        assert llm.engine.num_blocks == 40
        assert generate_tokens(llm, prompts) == expected
        assert llm.engine.stats.num_preemptions > 0


def test_logprobs_match_transformers_log_softmax(tiny_model):
    path = _model(tiny_model, "MistralForCausalLM")
    prompts = _prompts(5, lengths=(3, 50, 120))
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(logprobs=3),
                               use_tqdm=False)
    for output, (tokens, hf_rows) in zip(outputs, hf_greedy(path, prompts), strict=True):
        completion = output.outputs[0]
        assert completion.token_ids == tokens
        assert len(completion.logprobs) == MAX_TOKENS
        for step, (token, row) in enumerate(zip(tokens, hf_rows, strict=True)):
            entry = completion.logprobs[step]
            assert abs(entry[token] - row[token].item()) < 1e-4
            top = torch.topk(row, 3).indices.tolist()
            for t in top:
                assert abs(entry[t] - row[t].item()) < 1e-4
        assert abs(completion.cumulative_logprob - sum(hf_rows[i][t].item() for i, t in enumerate(tokens))) < 1e-3


def test_tensor_parallel_2_matches_transformers(tiny_model):
    path = _model(tiny_model, "LlamaForCausalLM")
    prompts = _prompts(6, lengths=(5, 33, 100, 250))
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, tensor_parallel_size=2) as llm:
        assert len([k for k in llm.engine.pids if k.startswith("executor")]) == 2
        assert generate_tokens(llm, prompts) == expected


def test_in_process_mode_matches_transformers(tiny_model):
    path = _model(tiny_model, "Qwen3ForCausalLM")
    prompts = _prompts(7, lengths=(2, 64, 180))
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, in_process=True) as llm:
        assert llm.engine.pids == {"executor0": os.getpid()}
        assert generate_tokens(llm, prompts) == expected


def test_prompt_logprobs_across_prefill_chunks_match_transformers(tiny_model):
    """Prompt logprobs of a 150-token prompt computed in 64-token chunks equal HF's log_softmax."""
    from tests.engine.hf_models import hf_logits

    path = _model(tiny_model, "Qwen3ForCausalLM")
    prompt = _prompts(8, lengths=(150,))[0]
    hf_rows = torch.log_softmax(hf_logits(load_hf_model(path), prompt), -1)
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_batched_tokens=64,
             max_num_seqs=8) as llm:
        out = llm.generate({"prompt_token_ids": prompt}, greedy(max_tokens=2, prompt_logprobs=2),
                           use_tqdm=False)[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry, row = out.prompt_logprobs[position], hf_rows[position - 1]
        assert abs(entry[prompt[position]] - row[prompt[position]].item()) < 1e-4
        for t in torch.topk(row, 2).indices.tolist():
            assert abs(entry[t] - row[t].item()) < 1e-4


def test_async_scheduling_matches_transformers(tiny_model):
    """Each step scheduled while the previous one runs (the executor appends the token the scheduler has
    not seen yet): chunked prefill, stops at max_tokens of every length, and prefix hits stay exact."""
    path = _model(tiny_model, "Qwen3ForCausalLM")
    prompts = _prompts(9, lengths=(1, 17, 60, 129, 200))
    max_tokens = [1, 2, 5, 17, MAX_TOKENS]
    reference = hf_greedy(path, prompts)
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_batched_tokens=64,
             max_num_seqs=8, async_scheduling=True) as llm:
        for _ in range(2):                                   # the second round hits the prefix cache
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                   [greedy(max_tokens=m) for m in max_tokens], use_tqdm=False)
            assert [o.outputs[0].token_ids for o in outputs] == [t[:m] for (t, _), m in zip(reference, max_tokens)]
    assert any(o.num_cached_tokens for o in outputs)
