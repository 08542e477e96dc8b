"""Speculative decoding through the whole engine: greedy outputs equal the run without drafts and Hugging Face
transformers' token for token (fp32 tiny models), with every feature a verify step meets; no KV block leaks.

Prompts repeat themselves (a random stretch three times), and random tiny models fall into loops, so the
proposers draft often and are right often enough to exercise accepted runs, bonus tokens and rejections.
"""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.engine.hf_models import ARCHITECTURES, tiny_model_fixture  # noqa: F401
from tests.engine.test_llm_equivalence import BLOCK_BYTES_FP32, MAX_LEN, generate_tokens, greedy, hf_greedy

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": None}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 5, "disable_by_batch_size": None}


def repeating_prompts(seed: int, lengths=(6, 20, 45, 90)) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for n in lengths:
        stretch = [rng.randrange(512) for _ in range(n)]
        prompts.append(stretch * 3 + stretch[: n // 2])
    return prompts


def assert_drafted_and_no_leak(llm: LLM) -> None:
    stats = llm.engine.stats
    assert stats.spec_num_accepted_tokens > 0 and stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens
    assert stats.num_free_blocks == llm.engine.num_blocks - 1 and stats.num_running == 0


@pytest.mark.parametrize("spec", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_greedy_with_drafts_matches_transformers(tiny_model, spec):
    """With chunked prefill (64-token steps) and, in the second round, prefix-cache hits."""
    path = tiny_model("LlamaForCausalLM", max_position_embeddings=MAX_LEN)
    prompts = repeating_prompts(1)
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, max_num_batched_tokens=64,
             max_num_seqs=8, speculative_config=spec) as llm:
        assert generate_tokens(llm, prompts) == expected
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outputs] == expected
        assert any(o.num_cached_tokens for o in outputs)
        assert_drafted_and_no_leak(llm)


def test_preemption_and_async_scheduling_with_drafts_match_transformers(tiny_model):
    path = tiny_model("Qwen2ForCausalLM", max_position_embeddings=MAX_LEN)
    prompts = repeating_prompts(2, lengths=(8, 30, 60, 100, 12, 50))
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, kv_cache_memory=40 * BLOCK_BYTES_FP32,
             async_scheduling=True, speculative_config=NGRAM) as llm:
        assert generate_tokens(llm, prompts) == expected
        assert llm.engine.stats.num_preemptions > 0
        assert_drafted_and_no_leak(llm)


def test_tensor_parallel_with_drafts_matches_transformers(tiny_model):
    path = tiny_model("LlamaForCausalLM", max_position_embeddings=MAX_LEN)
    prompts = repeating_prompts(3, lengths=(10, 40))
    expected = [tokens for tokens, _ in hf_greedy(path, prompts)]
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, tensor_parallel_size=2,
             speculative_config=NGRAM) as llm:
        assert generate_tokens(llm, prompts) == expected
        assert_drafted_and_no_leak(llm)


def test_logprobs_penalties_and_seeded_samples_with_drafts(tiny_model):
    """Logprobs of accepted tokens are HF's log_softmax there; penalised greedy and seeded sampled requests
    (n = 2) give the very tokens of the run without drafts."""
    path = tiny_model("MistralForCausalLM", max_position_embeddings=MAX_LEN)
    prompts = repeating_prompts(4, lengths=(7, 25, 70))
    other = [greedy(repetition_penalty=1.2, frequency_penalty=0.3, min_tokens=5),
             SamplingParams(n=2, temperature=0.9, top_k=20, seed=11, max_tokens=24, ignore_eos=True),
             SamplingParams(temperature=1.0, presence_penalty=0.5, seed=5, max_tokens=24, ignore_eos=True)]

    def run(llm):
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], other, use_tqdm=False)
        return [[c.token_ids for c in o.outputs] for o in outputs]

    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN) as llm:
        plain = run(llm)
    with LLM(str(path), skip_tokenizer_init=True, max_model_len=MAX_LEN, speculative_config=NGRAM) as llm:
        assert run(llm) == plain
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(logprobs=3), use_tqdm=False)
        assert_drafted_and_no_leak(llm)
    for output, (tokens, hf_rows) in zip(outputs, hf_greedy(path, prompts), strict=True):
        completion = output.outputs[0]
        assert completion.token_ids == tokens and len(completion.logprobs) == len(tokens)
        for token, entry, row in zip(tokens, completion.logprobs, hf_rows, strict=True):
            assert abs(entry[token] - row[token].item()) < 1e-4


def test_structured_outputs_and_stop_strings_with_drafts():
    """The demo model (byte-level tokenizer): grammar masks at every draft position, a matcher rolled back
    over rejected drafts, and stop strings inside an accepted run give the outputs of the run without (text,
    finish reason and token ids: the tokens after the one completing the stop string are dropped)."""
    regex = StructuredOutputsParams(regex=r"(ab|abc){3,12}")
    schema = StructuredOutputsParams(json={"type": "object", "properties": {"k": {"enum": ["xx", "xy"]}},
                                           "required": ["k"]})
    prompts = ["abcabcabc abcabc", "json json json", "stop stop stop stop", "xyzxyzxyzxyz"]
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=regex),
              SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=schema),
              SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=2, max_tokens=30, ignore_eos=True,
                             structured_outputs=regex)]

    def run(llm, params):
        return [(o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].token_ids)
                for o in llm.generate(prompts, params, use_tqdm=False)]

    with LLM(max_model_len=512) as llm:
        plain = run(llm, params)
        stop_text = plain[2][0]
        stop = stop_text[len(stop_text) // 2: len(stop_text) // 2 + 2]
        with_stop = [*params[:2], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]),
                     params[3]]
        plain_stop = run(llm, with_stop)
    with LLM(max_model_len=512, speculative_config={**NGRAM, "prompt_lookup_min": 1}) as llm:
        assert run(llm, params) == plain
        assert run(llm, with_stop) == plain_stop
        assert llm.engine.stats.spec_num_accepted_tokens > 0
    assert plain_stop[2][:2] == (stop_text[: stop_text.index(stop)], "stop")
