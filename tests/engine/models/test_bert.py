"""The BERT-family encoder against HF transformers on the same weights, and its parts: packed bidirectional
attention (length groups), pooling, checkpoint names, the oneDNN float32 matmuls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.attention.bidirectional import EncoderMetadata, bidirectional_attention
from engine.config import ConfigError, EngineConfig
from engine.layers import onednn_matmul
from engine.layers.pooler import pool
from engine.models.bert import BertModel
from engine.models.encoder_args import EncoderArgs
from engine.models.loader import load_model
from tests.engine.pooling_models import tiny_encoder_fixture  # noqa: F401  (pytest fixture)

ARCHS = ("BertModel", "RobertaModel", "XLMRobertaModel")
# one short sequence alone in its class, several per class, and classes from 8 up to 96 tokens
LENGTHS = [1, 3, 8, 9, 20, 22, 40, 70, 100]


def _load(path, **options):
    config = EngineConfig(model=str(path), max_model_len=100, device="cpu", **options).finalize()
    return load_model(config, device="cpu", progress=False)


def _ours(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    lens = np.array([len(s) for s in sequences])
    ids = torch.tensor([t for s in sequences for t in s])
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.inference_mode():
        hidden = model(ids, positions, EncoderMetadata.build(lens, torch.device("cpu")))
    return list(hidden.split(lens.tolist()))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("packed_weights", [False, True], ids=["torch-linear", "onednn"])
def test_a_packed_batch_matches_hf_sequence_by_sequence(tiny_encoder, arch, packed_weights):
    from transformers import AutoModel

    path = tiny_encoder(arch)
    model = _load(path)
    if packed_weights:
        if not onednn_matmul.available():
            pytest.skip("torch has no oneDNN here")
        assert onednn_matmul.pack_float32_matmuls(model) == 4 * 2       # qkv, out, intermediate, output x 2 layers
    hf = AutoModel.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    sequences = [[2, *rng.integers(5, hf.config.vocab_size, max(n - 2, 0)).tolist(), 3][:n] for n in LENGTHS]
    for seq, ours in zip(sequences, _ours(model, sequences), strict=True):
        with torch.inference_mode():
            ref = hf(torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


def test_attention_groups_lengths_and_matches_per_sequence_attention():
    lens = np.array(LENGTHS)
    metadata = EncoderMetadata.build(lens, torch.device("cpu"))
    # a group pads to its longest member, and its members share a length class (no 1-token sequence padded to 100)
    starts = np.cumsum(lens) - lens
    assert sum(group.batch for group in metadata.groups) == len(lens) and len(metadata.groups) == 6
    for group in metadata.groups:
        members = lens[np.isin(starts, group.gather.view(group.batch, group.length)[:, 0].numpy())]
        assert group.length == members.max() <= max(8, 2 * members.min())
    heads, dim = 2, 8
    qkv = torch.randn(int(lens.sum()), 3 * heads * dim)
    out = bidirectional_attention(qkv, heads, dim, metadata, dim**-0.5)
    for i, (start, n) in enumerate(zip(np.cumsum(lens) - lens, lens)):
        q, k, v = qkv[start:start + n].view(n, 3, heads, dim).unbind(1)
        ref = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
        torch.testing.assert_close(out[start:start + n], ref.reshape(n, heads * dim), msg=f"sequence {i}")


def test_equal_lengths_take_no_gather():
    metadata = EncoderMetadata.build(np.array([5, 5, 5]), torch.device("cpu"))
    assert len(metadata.groups) == 1 and metadata.groups[0].key_mask is None


@pytest.mark.parametrize("pooling_type", ["MEAN", "CLS", "LAST"])
def test_pooling_of_a_packed_batch(pooling_type):
    lens = [3, 1, 5]
    hidden = torch.randn(sum(lens), 4)
    pooled = pool(hidden, torch.tensor(lens), pooling_type)
    for row, part in zip(pooled, hidden.split(lens), strict=True):
        expected = {"MEAN": part.mean(0), "CLS": part[0], "LAST": part[-1]}[pooling_type]
        torch.testing.assert_close(row, expected)


def test_checkpoint_names_of_task_checkpoints():
    name = BertModel.checkpoint_name
    assert name("bert.encoder.layer.0.attention.self.query.weight") == "encoder.layer.0.attention.self.query.weight"
    assert name("roberta.embeddings.word_embeddings.weight") == "embeddings.word_embeddings.weight"
    assert name("encoder.layer.1.output.LayerNorm.gamma") == "encoder.layer.1.output.LayerNorm.weight"
    assert name("embeddings.LayerNorm.beta") == "embeddings.LayerNorm.bias"
    for unused in ("pooler.dense.weight", "bert.pooler.dense.bias", "cls.predictions.bias",
                   "embeddings.position_ids", "lm_head.dense.weight"):
        assert name(unused) is None


def test_encoder_configs_it_cannot_compute_are_refused():
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=16)
    with pytest.raises(ConfigError, match="relative_key"):
        EncoderArgs.from_hf_config({**base, "position_embedding_type": "relative_key"}, "BertModel")
    with pytest.raises(ConfigError, match="hidden_act 'swish'"):
        EncoderArgs.from_hf_config({**base, "hidden_act": "swish"}, "BertModel")
    roberta = EncoderArgs.from_hf_config({**base, "max_position_embeddings": 514, "pad_token_id": 1}, "RobertaModel")
    assert (roberta.position_offset, roberta.max_len) == (2, 512)


def test_an_encoder_cannot_generate(tiny_encoder):
    with pytest.raises(ConfigError, match="encoder model.*cannot generate"):
        EngineConfig(model=str(tiny_encoder()), runner="generate").finalize()
    config = EngineConfig(model=str(tiny_encoder())).finalize()
    assert (config.runner, config.is_encoder, config.max_model_len) == ("pooling", True, 32)   # sentence_bert_config


@pytest.mark.skipif(not onednn_matmul.available(), reason="torch has no oneDNN here")
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_onednn_matmul_matches_torch(rows):
    weight, bias, x = torch.randn(48, 40), torch.randn(48), torch.randn(rows, 40)
    packed = onednn_matmul.pack(weight)
    torch.testing.assert_close(onednn_matmul.linear(x, packed, bias), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(onednn_matmul.linear(x, packed, bias, "gelu"), F.gelu(F.linear(x, weight, bias)),
                               atol=1e-5, rtol=1e-5)
