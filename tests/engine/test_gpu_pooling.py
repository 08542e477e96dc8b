"""Pooling models on a CUDA GPU against HF transformers on the CPU: the encoder (torch SDPA over length groups)
in float32 and bfloat16, and a decoder with runner pooling (Triton paged attention, CUDA graphs for 1-token
last chunks). Only transformers is needed (no sentence-transformers: a GPU host may lack it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401  (pytest fixture)
from tests.engine.pooling_models import tiny_encoder_fixture  # noqa: F401

pytestmark = pytest.mark.gpu

LENGTHS = (1, 5, 9, 20, 31, 32)


def _prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(5, vocab, n).tolist() for n in LENGTHS]


@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_the_encoder_on_cuda_matches_hf_mean_pooling(tiny_encoder, dtype, atol):
    from transformers import AutoModel

    path = tiny_encoder("BertModel")
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(hf.config.vocab_size)
    with LLM(str(path), device="cuda", dtype=dtype, in_process=True) as llm:
        ours = np.array([o.outputs.embedding for o in llm.embed(prompts, use_tqdm=False)])
    for prompt, vector in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            mean = hf(torch.tensor([prompt])).last_hidden_state[0].mean(0)
        np.testing.assert_allclose(vector, (mean / mean.norm()).numpy(), atol=atol)


def test_a_decoder_with_runner_pooling_on_cuda(tiny_model):
    from transformers import AutoModel

    path = tiny_model("Qwen3ForCausalLM")
    prompts = [*_prompts(512), list(range(1, 38))]
    with LLM(str(path), runner="pooling", device="cuda", dtype="float32", max_num_batched_tokens=16,
             max_num_seqs=4, block_size=16) as llm:
        ours = np.array([o.outputs.embedding for o in llm.embed(prompts, use_tqdm=False)])
    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, vector in zip(prompts, ours, strict=True):
        with torch.inference_mode():
            last = hf(torch.tensor([prompt])).last_hidden_state[0, -1]
        np.testing.assert_allclose(vector, (last / last.norm()).numpy(), atol=1e-4)
