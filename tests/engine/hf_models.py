"""Tiny random-weight Hugging Face models, and a way to run ours on them as the model runner does.

`make_tiny_model(arch, path, **overrides)` saves a 2-layer model of each supported architecture (fp32
safetensors, config.json) with its distinguishing features switched on; `tiny_model` is the pytest fixture
that builds each variant once per session. `hf_logits` is the oracle. `PagedBatchRunner` drives our model
with one flattened batch per step over a paged KV cache whose blocks are handed out shuffled, so a request's
blocks are never contiguous. transformers is imported lazily: tensor-parallel workers import this module
too, and they should not pay for it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.attention import AttentionMetadata

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

BASE_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)

# What each architecture switches on (Qwen2's qkv bias and Qwen3's q/k norm are built into the class).
FEATURES = {
    "LlamaForCausalLM": dict(
        tie_word_embeddings=False,
        # A short original context puts the rotary frequencies in all three llama3 bands.
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32),
    ),
    "MistralForCausalLM": dict(tie_word_embeddings=False, sliding_window=None),
    "Qwen2ForCausalLM": dict(tie_word_embeddings=True),
    # head_dim * heads != hidden_size, as in the real Qwen3 models.
    "Qwen3ForCausalLM": dict(tie_word_embeddings=True, head_dim=32),
}

WEIGHT_STD = 0.1     # large enough that attention is far from uniform, small enough to stay tame


def make_tiny_model(arch: str, path: str | Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random-weight `arch` model (fp32 safetensors + config.json) into `path`; returns it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                  "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}[arch]
    config = AutoConfig.for_model(model_type, **{**BASE_CONFIG, **FEATURES[arch], **overrides})
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.copy_(WEIGHT_STD * torch.randn_like(param))
    path = Path(path)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session", name="tiny_model")
def tiny_model_fixture(tmp_path_factory):
    """tiny_model(arch, **overrides) -> a saved model directory, built once per session per variant."""
    built: dict[tuple, Path] = {}

    def build(arch: str, **overrides) -> Path:
        key = (arch, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in built:
            built[key] = make_tiny_model(arch, tmp_path_factory.mktemp(arch), **overrides)
        return built[key]

    return build


def load_hf_model(path: str | Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    """HF's float32 logits [len(token_ids), vocab] for one unpadded sequence."""
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


class PagedBatchRunner:
    """Runs our model on requests whose tokens arrive in chunks, one flattened batch per step.

    Keeps each request's block table and length; `step({req: new_tokens})` writes the new tokens' KV into
    the paged cache and returns each request's logits at its new positions.
    """

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, seed: int = 0):
        self.model = model
        self.block_size = block_size
        self.kv_caches = [
            torch.zeros(2, num_blocks, block_size, model.num_kv_heads, model.head_dim, dtype=model.dtype)
            for _ in range(model.num_layers)
        ]
        self.free_blocks = list(range(1, num_blocks))       # block 0 is the runner's null block
        random.Random(seed).shuffle(self.free_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        input_ids, positions, slots, query_start, seq_lens = [], [], [], [0], []
        for req, tokens in new_tokens.items():
            start = self.lengths.get(req, 0)
            end = start + len(tokens)
            table = self.block_tables.setdefault(req, [])
            while len(table) * self.block_size < end:
                table.append(self.free_blocks.pop())
            for pos in range(start, end):
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            input_ids += tokens
            positions += range(start, end)
            query_start.append(query_start[-1] + len(tokens))
            seq_lens.append(end)
            self.lengths[req] = end
        width = max(len(self.block_tables[req]) for req in new_tokens)
        tables = [self.block_tables[req] + [0] * (width - len(self.block_tables[req])) for req in new_tokens]
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            max_query_len=max(len(tokens) for tokens in new_tokens.values()),
            max_seq_len=max(seq_lens),
            num_actual_tokens=len(input_ids),
        )
        with torch.inference_mode():
            hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), self.kv_caches, metadata)
            logits = self.model.compute_logits(hidden)
        return dict(zip(new_tokens, logits.split([len(t) for t in new_tokens.values()]), strict=True))
