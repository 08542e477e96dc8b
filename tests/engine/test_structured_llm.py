"""Structured outputs through the offline LLM and the real processes, on the demo model (random weights,
byte-level tokenizer): the torch executor masks the logits, so a valid output is the grammar's doing."""

from __future__ import annotations

import math

import pytest

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.engine.structured_checks import check_output, constraints

EOS = [258]


@pytest.fixture(scope="module")
def llm():
    with LLM(max_model_len=512, max_num_seqs=16) as llm:          # the built-in demo model
        yield llm


def test_every_kind_greedy_and_seeded(llm):
    kinds = constraints()
    short = ["regex", "choice", "grammar"]
    prompts = [f"give me {kind}" for kind in kinds] + [f"seeded {kind}" for kind in short]
    params = [SamplingParams(temperature=0.0, max_tokens=100, structured_outputs=so) for so in kinds.values()]
    params += [SamplingParams(temperature=1.0, seed=7, max_tokens=30, structured_outputs=kinds[k]) for k in short]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    expected = list(kinds.values()) + [kinds[k] for k in short]
    for output, so in zip(outputs, expected, strict=True):
        c = output.outputs[0]
        check_output(so, c.token_ids, c.text, c.finish_reason, EOS)
    # the bounded grammars end (the any-object one need not, from random weights)
    assert all(o.outputs[0].finish_reason == "stop" for i, o in enumerate(outputs) if i != 1)
    again = llm.generate(prompts[:-4:-1], params[:-4:-1], use_tqdm=False)[::-1]    # other batch, other order
    assert [o.outputs[0].token_ids for o in outputs[-3:]] == [o.outputs[0].token_ids for o in again]


def test_parallel_samples_each_valid(llm):
    so = StructuredOutputsParams(json={"type": "object", "properties": {
        "k": {"enum": ["x", "y"]}, "v": {"type": "integer", "minimum": -5, "maximum": 5}},
        "required": ["k", "v"]}, disable_any_whitespace=True)
    output = llm.generate("n=4", SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=40,
                                                 structured_outputs=so), use_tqdm=False)[0]
    assert len(output.outputs) == 4
    for c in output.outputs:
        check_output(so, c.token_ids, c.text, c.finish_reason, EOS)


def test_logprobs_see_the_mask(llm):
    so = StructuredOutputsParams(regex="[ab]{8}")
    c = llm.generate("lp", SamplingParams(temperature=1.0, seed=1, max_tokens=10, logprobs=5,
                                          structured_outputs=so), use_tqdm=False)[0].outputs[0]
    assert c.text and set(c.text) <= {"a", "b"}
    allowed = {ord("a"), ord("b")}
    for token, row in zip(c.token_ids, c.logprobs, strict=False):
        if token in EOS:
            continue
        assert math.isfinite(row[token])
        finite = {t for t, lp in row.items() if lp != -math.inf}
        assert finite <= allowed | set(EOS)
        # the two allowed tokens carry all the probability mass
        assert math.isclose(sum(math.exp(lp) for lp in row.values()), 1.0, rel_tol=1e-3)


def test_free_requests_unchanged_beside_constrained_ones(llm):
    free = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 2
    alone = llm.generate(["free one", "free two"], free, use_tqdm=False)
    so = constraints()["choice"]
    mixed = llm.generate(["free one", "x", "free two"],
                         [free[0], SamplingParams(temperature=0.0, max_tokens=10, structured_outputs=so), free[1]],
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in alone] == [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids]
    assert mixed[1].outputs[0].text in so.choice


def test_invalid_spec_is_refused_before_it_reaches_the_engine(llm):
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="(?<=a)b")),
                     use_tqdm=False)
    assert llm.generate("x", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)[0].finished


def test_async_scheduling_gives_the_same_constrained_outputs():
    """Under --async-scheduling a constrained request waits for its in-flight token before its next mask
    is filled, so the outputs equal the serial engine's (the fake model: cheap, and adversarial)."""
    kinds = list(constraints().values())
    prompts = [f"p{i}" for i in range(8)]
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=kinds[i % len(kinds)])
              if i % 2 == 0 else SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
              for i in range(len(prompts))]
    runs = []
    for async_scheduling in (False, True):
        with LLM(load_format="fake", max_model_len=256, max_num_seqs=8,
                 async_scheduling=async_scheduling) as fake:
            runs.append([o.outputs[0] for o in fake.generate(prompts, params, use_tqdm=False)])
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]
    for i in range(0, len(prompts), 2):
        c = runs[1][i]
        check_output(kinds[i % len(kinds)], c.token_ids, c.text, c.finish_reason, EOS)
