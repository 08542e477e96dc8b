"""The weight loader: single-file and sharded safetensors, dtype conversion, dummy weights, per-rank slices,
and the errors for checkpoints that do not match their config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.attention import TorchAttention
from engine.config import ConfigError, EngineConfig
from engine.layers import TensorSource
from engine.models import LlamaForCausalLM, ModelArgs
from engine.models.loader import (
    checkpoint_params,
    load_dummy_weights,
    load_model,
    load_safetensors_weights,
    load_tensor,
)
from tests.conftest import shared_path
from tests.engine.hf_models import PagedBatchRunner, tiny_model_fixture  # noqa: F401  (the tiny_model fixture)


def _load(path, **config):
    return load_model(EngineConfig(model=str(path), **config), device="cpu", progress=False)


def _copy_model(src, dst, drop=(), add=None):
    """A copy of a saved model whose safetensors lack `drop` and gain `add`."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if k not in drop}
    save_file({**tensors, **(add or {})}, dst / "model.safetensors")
    return dst


def _state(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _logits(model, tokens=(3, 1, 4, 1, 5, 9, 2, 6)):
    return PagedBatchRunner(model).step({"r": list(tokens)})["r"]


def test_sharded_checkpoint_loads_like_a_single_file(tiny_model, tmp_path):
    src = tiny_model("Qwen3ForCausalLM")
    tensors = load_file(src / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        part = names[i::3]
        save_file({name: tensors[name] for name in part}, tmp_path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(src / "config.json", tmp_path / "config.json")

    single, sharded = _state(_load(src)), _state(_load(tmp_path))
    assert single.keys() == sharded.keys()
    for name in single:
        assert torch.equal(single[name], sharded[name]), name


def test_index_naming_an_absent_shard_is_an_error(tiny_model, tmp_path):
    path = _copy_model(tiny_model("Qwen3ForCausalLM"), tmp_path / "m")
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        _load(path)


def test_bfloat16_conversion(tiny_model):
    path = tiny_model("LlamaForCausalLM")
    fp32, bf16 = _load(path), _load(path, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert torch.equal(bf16.lm_head.weight, fp32.lm_head.weight.to(torch.bfloat16))
    logits = _logits(bf16)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, _logits(fp32), atol=0.1, rtol=0.05)


def test_dummy_weights_need_only_config_json(tmp_path):
    config = shared_path("models", "configs", "qwen3-tiny")
    shutil.copy(config / "config.json", tmp_path / "config.json")
    model = _load(tmp_path, load_format="dummy", max_model_len=512)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes["model.embed_tokens.weight"] == (151936, 256)
    assert shapes["model.layers.3.self_attn.qkv_proj.weight"] == ((8 + 2 * 4) * 32, 256)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (32,)
    assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == (2 * 768, 256)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    logits = _logits(model)
    assert torch.isfinite(logits).all() and logits.std() > 0.1


def test_dummy_weights_are_a_function_of_the_seed(tiny_model):
    path = tiny_model("Qwen2ForCausalLM")
    a, b = _state(_load(path, load_format="dummy")), _state(_load(path, load_format="dummy"))
    c = _state(_load(path, load_format="dummy", seed=1))
    name = "model.layers.1.self_attn.qkv_proj.bias"
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a[name], c[name])
    assert torch.equal(a["model.norm.weight"], torch.ones(64))


def _shard(path, tp_rank, tp_size, dummy=False):
    """Rank `tp_rank`'s shard of a tp_size model, built without a process group (loading needs none)."""
    config = EngineConfig(model=str(path)).finalize()
    args = ModelArgs.from_hf_config(config.hf_config(), config.architecture)
    model = LlamaForCausalLM(args, TorchAttention(), tp_rank=tp_rank, tp_size=tp_size)
    if dummy:
        load_dummy_weights(model, seed=0, progress=False)
    else:
        load_safetensors_weights(model, str(path), progress=False)
    return model


@pytest.mark.parametrize(
    "kv_heads, tp_size, rank, q_rows, kv_rows",
    [
        (2, 2, 1, slice(32, 64), slice(16, 32)),    # KV heads split: rank 1 keeps head 1
        (2, 4, 3, slice(48, 64), slice(16, 32)),    # each KV head on 2 ranks: rank 3 keeps head 1
        (1, 2, 1, slice(32, 64), slice(0, 16)),     # the one KV head on both ranks
    ],
)
def test_each_rank_keeps_its_slice(tiny_model, kv_heads, tp_size, rank, q_rows, kv_rows):
    path = tiny_model("Qwen2ForCausalLM", num_key_value_heads=kv_heads)
    full = load_file(path / "model.safetensors")
    attn = _shard(path, tp_rank=rank, tp_size=tp_size).model.layers[0].self_attn
    prefix = "model.layers.0.self_attn."
    for kind in ("weight", "bias"):
        expected = torch.cat([full[f"{prefix}q_proj.{kind}"][q_rows], full[f"{prefix}k_proj.{kind}"][kv_rows],
                              full[f"{prefix}v_proj.{kind}"][kv_rows]])
        assert torch.equal(getattr(attn.qkv_proj, kind), expected), kind
    assert torch.equal(attn.o_proj.weight, full[prefix + "o_proj.weight"][:, q_rows])


def test_a_rank_reads_only_its_share_of_each_tensor(tiny_model):
    path = tiny_model("LlamaForCausalLM", num_key_value_heads=1, vocab_size=510)
    args = ModelArgs.from_hf_config(json.loads((path / "config.json").read_text()), "LlamaForCausalLM")
    model = LlamaForCausalLM(args, TorchAttention(), tp_rank=1, tp_size=2)
    read = 0

    class CountingSource(TensorSource):
        def read(self):
            nonlocal read
            read += self.tensor.numel()
            return self.tensor

        def narrow(self, dim, start, length):
            nonlocal read
            out = self.tensor.narrow(dim, start, length)
            read += out.numel()
            return out

    tensors = load_file(path / "model.safetensors")
    for name, target in checkpoint_params(model).items():
        load_tensor(name, target, CountingSource(tensors[name]))
    assert read == sum(p.numel() for p in model.parameters())        # no padding: 510 / 2 rows each
    assert read < sum(t.numel() for t in tensors.values()) * 0.6


def test_dummy_weights_are_the_same_at_every_tensor_parallel_size(tiny_model):
    path = tiny_model("MistralForCausalLM")
    whole = _shard(path, 0, 1, dummy=True)
    halves = [_shard(path, rank, 2, dummy=True) for rank in (0, 1)]
    name = "model.layers.1.mlp.down_proj.weight"
    parts = [dict(h.named_parameters())[name] for h in halves]
    assert torch.equal(torch.cat(parts, dim=1), dict(whole.named_parameters())[name])


def test_missing_tensor_is_named(tiny_model, tmp_path):
    path = _copy_model(tiny_model("MistralForCausalLM"), tmp_path / "m",
                       drop={"model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(ValueError, match=r"1 missing tensor\(s\): model.layers.1.mlp.up_proj.weight"):
        _load(path)


def test_unexpected_tensor_is_named(tiny_model, tmp_path):
    path = _copy_model(tiny_model("MistralForCausalLM"), tmp_path / "m",
                       add={"model.layers.7.mlp.up_proj.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"1 unexpected tensor\(s\): model.layers.7.mlp.up_proj.weight"):
        _load(path)


def test_tensors_hf_ignores_are_ignored(tiny_model, tmp_path):
    src = tiny_model("Qwen2ForCausalLM")                      # tied: the checkpoint has no lm_head
    extra = {"lm_head.weight": torch.zeros(512, 64), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    path = _copy_model(src, tmp_path / "m", add=extra)
    assert torch.equal(_logits(_load(path)), _logits(_load(src)))


def test_wrong_shape_is_named(tiny_model, tmp_path):
    path = _copy_model(tiny_model("MistralForCausalLM"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"mlp.down_proj.weight has shape \[64, 128\].*expects \[64, 96\]"):
        _load(path)


def test_unsupported_architecture_is_an_error(tiny_model, tmp_path):
    path = _copy_model(tiny_model("MistralForCausalLM"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        _load(path)


def test_no_weight_files_is_an_error_that_mentions_dummy(tmp_path, tiny_model):
    (tmp_path / "m").mkdir()
    shutil.copy(tiny_model("MistralForCausalLM") / "config.json", tmp_path / "m" / "config.json")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights.*'dummy'"):
        _load(tmp_path / "m")


def test_progress_bar_goes_to_stderr_and_can_be_disabled(tiny_model, capsys):
    config = EngineConfig(model=str(tiny_model("MistralForCausalLM")))
    load_model(config, device="cpu", progress=True)
    assert "Loading weights" in capsys.readouterr().err
    load_model(config, device="cpu", progress=False)
    assert capsys.readouterr().err == ""


def test_tensor_parallel_load_without_a_group_is_refused(tiny_model):
    config = EngineConfig(model=str(tiny_model("MistralForCausalLM")), tensor_parallel_size=2)
    with pytest.raises(RuntimeError, match=r"init_tensor_parallel\(0, 2, ...\) first; this process is rank 0 of 1"):
        load_model(config, device="cpu", tp_rank=0, tp_size=2, progress=False)
    with pytest.raises(ValueError, match="tp_rank 2 is outside a tensor-parallel group of size 2"):
        load_model(config, device="cpu", tp_rank=2, tp_size=2, progress=False)


def test_fake_load_format_has_no_model(tiny_model):
    with pytest.raises(ConfigError, match="load_format 'fake'"):
        _load(tiny_model("MistralForCausalLM"), load_format="fake")
