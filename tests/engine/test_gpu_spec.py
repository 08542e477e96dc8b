"""On a GPU: speculative decoding with CUDA graphs on gives the greedy tokens of the run without drafts, in
float32 where the comparison is exact, and its verify steps (several query tokens per request) replay the
decode graphs, one decode row per query token. Skipped without CUDA."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.executor.cuda_graphs import CudaGraphRunner
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.gpu


def _generate(path, prompts, **engine_args):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    with LLM(str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=512, **engine_args) as llm:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], llm.engine.stats


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_drafts_with_cuda_graphs_equal_the_plain_run(tiny_model, method, monkeypatch):
    path = tiny_model("LlamaForCausalLM", max_position_embeddings=512)
    rng = random.Random(5)
    prompts = []
    for n in (4, 16, 50):
        stretch = [rng.randrange(512) for _ in range(n)]
        prompts.append(stretch * 3)
    plain, _ = _generate(path, prompts)
    replayed: list[int] = []            # max_query_len of every replayed step (in-process: seen here)
    replay = CudaGraphRunner.run
    monkeypatch.setattr(CudaGraphRunner, "run", lambda self, inputs: (replayed.append(inputs.max_query_len),
                                                                      replay(self, inputs))[1])
    spec = {"method": method, "num_speculative_tokens": 4, "disable_by_batch_size": None}
    if method == "ngram":
        spec.update(prompt_lookup_min=1, prompt_lookup_max=3)
    drafted, stats = _generate(path, prompts, speculative_config=spec, in_process=True)
    assert drafted == plain
    assert stats.spec_num_accepted_tokens > 0
    assert max(replayed) > 1, "no verify step replayed a graph"
