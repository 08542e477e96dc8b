"""The offline API's surface, with vLLM's names: prompt forms, parallel sampling, seeds, stop strings,
chat templates of the real tokenizers, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, SamplingParams
from engine.outputs import RequestDelta
from tests.conftest import shared_path


@pytest.fixture(scope="module")
def llm():
    with LLM(max_model_len=1024) as llm:          # the built-in demo model
        yield llm


def test_prompt_forms_keep_input_order(llm):
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    single = llm.generate("Hello", params, use_tqdm=False)
    assert len(single) == 1 and single[0].prompt == "Hello"
    assert single[0].prompt_token_ids == llm.get_tokenizer().encode("Hello")
    mixed = llm.generate(["abc", {"prompt_token_ids": [100, 101, 102]}, "Hello"], params, use_tqdm=False)
    assert [o.prompt for o in mixed] == ["abc", None, "Hello"]
    assert mixed[1].prompt_token_ids == [100, 101, 102]
    assert mixed[2].outputs[0].token_ids == single[0].outputs[0].token_ids
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in mixed)


def test_one_params_per_prompt(llm):
    outputs = llm.generate(["a", "b"], [SamplingParams(max_tokens=2, ignore_eos=True),
                                        SamplingParams(max_tokens=5, ignore_eos=True)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 5]
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()], use_tqdm=False)


def test_seeds_reproduce_and_parallel_samples_differ(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=1234, n=3, ignore_eos=True)
    first = llm.generate("seeded", params, use_tqdm=False)[0]
    again = llm.generate(["other prompt", "seeded"], params, use_tqdm=False)[1]   # different batch
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3


def test_stop_strings_end_the_text(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    text = llm.generate("stop here", greedy, use_tqdm=False)[0].outputs[0].text
    stop = text[4:6]
    out = llm.generate("stop here", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                   stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert out.text == text[: text.index(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_logprobs_and_prompt_logprobs_shapes(llm):
    out = llm.generate("abcdef", SamplingParams(max_tokens=3, logprobs=2, prompt_logprobs=1, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs) == 3
    for token, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs, strict=True):
        assert token in entry and 2 <= len(entry) <= 3 and all(v <= 0 for v in entry.values())
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(e[t] for t, e in zip(out.outputs[0].token_ids, out.outputs[0].logprobs, strict=True)), abs=1e-4)
    assert len(out.prompt_logprobs) == len(out.prompt_token_ids) and out.prompt_logprobs[0] is None
    for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert token in entry


def test_bad_input_is_refused_before_anything_runs(llm):
    with pytest.raises(TypeError, match="prompt 1"):
        llm.generate(["ok", 42], use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 1024}, use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary|prompt token ids"):
        llm.generate({"prompt_token_ids": [10**6]}, use_tqdm=False)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-0.5)
    assert llm.engine.num_unfinished == 0                # nothing was left half-added


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_chat_renders_the_real_chat_templates(family, tmp_path):
    from transformers import AutoTokenizer

    tokenizer_dir = shared_path("models", "tokenizers", family)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    arch, model_type = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama3": ("LlamaForCausalLM", "llama")}[family]
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": [arch], "model_type": model_type,
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "torch_dtype": "float32", "tie_word_embeddings": True}))
    conversations = [[{"role": "user", "content": "Hello, wörld 🌍"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]]
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Time now",
                                               "parameters": {"type": "object", "properties": {}}}}]
    with LLM(str(tmp_path), load_format="dummy") as llm:
        outputs = llm.chat(conversations, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
        with_tools = llm.chat(conversations[1], SamplingParams(max_tokens=1), use_tqdm=False, tools=tools)[0]
    text = tokenizer.apply_chat_template(conversations[1], tools=tools, add_generation_prompt=True, tokenize=False)
    assert with_tools.prompt == text and (family != "qwen3" or "get_time" in text)
    for conversation, output in zip(conversations, outputs, strict=True):
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert output.prompt == text
        assert output.prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
        assert len(output.outputs[0].token_ids) == 3


def test_profiling_through_the_engine_processes(llm, tmp_path):
    llm.start_profile(str(tmp_path))
    llm.generate("profiled", SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    path = llm.stop_profile()
    assert path.startswith(str(tmp_path)) and "traceEvents" in open(path).read()


def test_news_after_a_stop_string_in_the_same_poll_is_ignored(llm, monkeypatch):
    """A stop string ends a sequence in the frontend while the engine has already produced more steps;
    when one poll returns those later steps too, the sequence must be counted finished once (counting it
    again made generate() wait forever for a sequence that does not exist)."""
    ids = llm.get_tokenizer().encode("abXYcdef", add_special_tokens=False)
    added, aborted, polls = [], [], []
    defaults = llm.engine.generation_defaults

    class ScriptedEngine:
        generation_defaults = defaults

        def add_request(self, child_id, prompt_token_ids, params):
            added.append(child_id)

        def abort_request(self, child_id):
            aborted.append(child_id)

        def poll(self, timeout=None):
            polls.append(timeout)
            assert len(polls) == 1, "generate() polled again after every sequence had finished"
            (request_id,) = added
            return [RequestDelta(request_id, ids[:4]), RequestDelta(request_id, ids[4:6]),
                    RequestDelta(request_id, ids[6:], finished=True, finish_reason="length")]

    monkeypatch.setattr(llm, "engine", ScriptedEngine())
    params = SamplingParams(temperature=0.0, max_tokens=8, stop=["XY"])
    (output,) = llm.generate("x", params, use_tqdm=False)
    assert output.outputs[0].text == "ab" and output.outputs[0].stop_reason == "XY"
    assert aborted == added
