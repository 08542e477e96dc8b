"""Building a model shard and filling its weights: safetensors (one file or a sharded index), GGUF or dummy.

Checkpoint tensors keep their Hugging Face names; each is routed to the module, parameter and shard id it
loads into (`checkpoint_params`), and that module's weight_loader keeps only this rank's part. Safetensors
are read through lazy slices, so a rank reads only its shard's bytes. Dummy weights are generated per
checkpoint tensor from (seed, name) at the tensor's full shape and go through the same weight loaders, so
a dummy model is the same at every tensor-parallel size. A GGUF file's tensors are dequantized one at a
time and arrive under their HF names (`gguf_weights`), so they too go through the same weight loaders.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import sys
import zlib
from collections.abc import Callable

import torch
from safetensors import safe_open
from tqdm import tqdm

from engine import distributed
from engine.attention import get_attention_backend
from engine.config import ConfigError, EngineConfig
from engine.layers.cpu_matmul import should_upcast, upcast_matmul_weights
from engine.layers.quantized import QuantizedSource
from engine.layers.weights import CheckpointWeights, SafetensorsSource, ShardId, TensorSource, WeightSource
from engine.models import CausalLM, get_model_class
from engine.models.gguf_file import is_gguf_path, read_gguf
from engine.models.gguf_quantized import plan_quantized
from engine.models.gguf_weights import gguf_checkpoint, hf_name
from engine.models.registry import model_args

logger = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
REPORTS_PER_LOAD = 20


def _tensors(iterable, desc: str, total: int, progress: bool, report: Progress | None):
    """The loop over checkpoint tensors: a tqdm bar on stderr, and report(done, total) every 1/20th."""
    bar = tqdm(iterable, desc=desc, unit="tensor", file=sys.stderr, total=total, disable=not progress)
    if report is None:
        yield from bar
        return
    every = max(1, total // REPORTS_PER_LOAD)
    for done, item in enumerate(bar, 1):
        yield item
        if done % every == 0 or done == total:
            report(done, total)

INDEX_FILE = "model.safetensors.index.json"

CheckpointParam = tuple[CheckpointWeights, torch.nn.Parameter, ShardId]


def load_model(
    config: EngineConfig,
    *,
    device: torch.device | str,
    tp_rank: int = 0,
    tp_size: int = 1,
    attention_backend: str = "torch",
    progress: bool = True,
    report: Progress | None = None,
) -> CausalLM:
    """Build this rank's shard of config.model on `device` and load its weights (config.load_format).

    At tp_size > 1, engine.distributed.init_tensor_parallel must have been called with the same size: the
    shard's forward pass all-reduces across the group. `report(done, total)` hears how many checkpoint
    tensors are in, a few dozen times over the load (the server's loading progress).
    """
    config.finalize()
    if config.load_format == "fake":
        raise ConfigError("load_format 'fake' has no model to load (the runner fakes the whole forward)")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is outside a tensor-parallel group of size {tp_size}")
    if tp_size > 1 and (distributed.tp_rank(), distributed.tp_size()) != (tp_rank, tp_size):
        raise RuntimeError(
            f"load_model(tp_rank={tp_rank}, tp_size={tp_size}) needs engine.distributed.init_tensor_parallel"
            f"({tp_rank}, {tp_size}, ...) first; this process is rank {distributed.tp_rank()} of "
            f"{distributed.tp_size()}"
        )
    args = model_args(config.hf_config(), config.architecture, config.max_model_len)
    dtype = getattr(torch, config.resolved_dtype)
    backend = get_attention_backend(attention_backend)
    with torch.device(device):
        model = get_model_class(args.architecture)(args, backend, tp_rank=tp_rank, tp_size=tp_size, dtype=dtype)
    show_progress = progress and tp_rank == 0
    if config.load_format == "dummy":
        load_dummy_weights(model, seed=config.seed, progress=show_progress, report=report)
    elif is_gguf_path(config.model):
        load_gguf_weights(model, config.model, quantization=config.quantization, progress=show_progress,
                          report=report)
    else:
        load_safetensors_weights(model, config.model, progress=show_progress, report=report)
    if should_upcast(torch.device(device), dtype):
        upcast_matmul_weights(model)
        model.activation_dtype = torch.float32        # see engine/models/llama.py
        if hasattr(model, "enable_cpu_decode"):
            reason = model.enable_cpu_decode()
            if reason is not None:
                logger.info("pure-decode steps run eagerly (no fused CPU decode: %s)", reason)
    return model.eval()


def checkpoint_params(model: CausalLM) -> dict[str, CheckpointParam]:
    """Every checkpoint tensor the model needs, by HF name -> (module, parameter, shard id).

    Tied embeddings appear once (model.embed_tokens.weight); fused parameters expand to their parts, e.g.
    ...self_attn.qkv_proj.weight -> q_proj.weight (shard "q"), k_proj.weight ("k"), v_proj.weight ("v").
    """
    stacked: dict[str, list[tuple[str, ShardId]]] = {}
    for fused, name, shard_id in model.STACKED_PARAMS:
        stacked.setdefault(fused, []).append((name, shard_id))
    params: dict[str, CheckpointParam] = {}
    for name, param in model.named_parameters():
        module_name, _, param_name = name.rpartition(".")
        module = model.get_submodule(module_name)
        parent, _, leaf = module_name.rpartition(".")
        for checkpoint_name, shard_id in stacked.get(leaf, [(leaf, None)]):
            prefix = f"{parent}." if parent else ""
            params[f"{prefix}{checkpoint_name}.{param_name}"] = (module, param, shard_id)
    return params


def load_tensor(hf_name: str, target: CheckpointParam, source: WeightSource) -> None:
    """Check a checkpoint tensor's shape and load this rank's part of it."""
    module, param, shard_id = target
    expected = module.checkpoint_shape(param, shard_id)
    if source.shape != expected:
        raise ValueError(f"checkpoint tensor {hf_name} has shape {list(source.shape)}; "
                         f"the model's config expects {list(expected)}")
    module.weight_loader(param, source, shard_id)


def load_safetensors_weights(model: CausalLM, model_dir: str, *, progress: bool = True,
                             report: Progress | None = None) -> None:
    """Fill every parameter from model_dir's safetensors (one file, several, or a sharded index)."""
    params = checkpoint_params(model)
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(safe_open(path, framework="pt", device="cpu"))
                 for path in _safetensors_files(model_dir)]
        # our name -> (file, the name stored in it): encoders map task checkpoints' names (BertModel.checkpoint_name)
        rename = getattr(model, "checkpoint_name", None)
        names = {(rename(stored) if rename else stored): (f, stored) for f in files for stored in f.keys()}
        names = {name: source for name, source in names.items() if name is not None and not _ignored(name, model)}
        _check_names(set(names), set(params), model_dir)
        for name, (f, stored) in _tensors(names.items(), "Loading weights", len(names), progress, report):
            load_tensor(name, params[name], SafetensorsSource(f.get_slice(stored)))


def load_gguf_weights(model: CausalLM, path: str, *, quantization: str = "none", progress: bool = True,
                      report: Progress | None = None) -> None:
    """Fill every parameter from a GGUF file: each tensor dequantized to float32 as it is loaded, or with
    quantization "gguf", the quantized tensors the kernels take kept in their blocks
    (engine/models/gguf_quantized.py)."""
    params = checkpoint_params(model)
    gguf = read_gguf(path)
    names = {hf: name for name in gguf.tensors if (hf := hf_name(name)) is not None and not _ignored(hf, model)}
    _check_names(set(names), set(params), path)
    device = next(model.parameters()).device
    blocks = plan_quantized(gguf, names, params, device) if quantization == "gguf" else set()
    quantized_layers = {params[hf][0]: None for hf in blocks}
    for name, tensor in _tensors(gguf_checkpoint(path, frozenset(names[hf] for hf in blocks)), "Loading GGUF weights",
                                 len(names), progress, report):
        if _ignored(name, model):
            continue
        if isinstance(tensor, QuantizedSource):
            module, param, shard_id = params[name]
            if tensor.shape != module.checkpoint_shape(param, shard_id):
                raise ValueError(f"checkpoint tensor {name} has shape {list(tensor.shape)}; the model's config "
                                 f"expects {list(module.checkpoint_shape(param, shard_id))}")
            module.load_quantized(tensor, shard_id)
        else:
            load_tensor(name, params[name], TensorSource(tensor))
    for layer in quantized_layers:
        layer.finish_quantized()
    embedding = getattr(model.model, "embed_tokens", None)
    if model.args.tie_word_embeddings and getattr(embedding, "qweight", None) is not None:
        model.lm_head.use_quantized(embedding.qweight)


def load_dummy_weights(model: CausalLM, *, seed: int, progress: bool = True, report: Progress | None = None) -> None:
    """Random weights of the checkpoint's shapes, a function of (seed, tensor name) only.

    Matrices are N(0, initializer_range) as HF initialises them and norm weights are ones, so activations
    stay in the range a trained model has (finite in float16 and bfloat16 too).
    """
    std = model.args.initializer_range
    params = checkpoint_params(model)
    for name, target in _tensors(sorted(params.items()), "Dummy weights", len(params), progress, report):
        module, param, shard_id = target
        shape = module.checkpoint_shape(param, shard_id)
        if name.lower().endswith("norm.weight"):
            tensor = torch.ones(shape, device=param.device)
        else:
            generator = torch.Generator(param.device).manual_seed(_tensor_seed(seed, name))
            tensor = torch.empty(shape, device=param.device).normal_(0.0, std, generator=generator)
        load_tensor(name, target, TensorSource(tensor))


def _safetensors_files(model_dir: str) -> list[str]:
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path} has no weight_map")
        files = sorted({os.path.join(model_dir, name) for name in weight_map.values()})
        absent = [os.path.basename(path) for path in files if not os.path.isfile(path)]
        if absent:
            raise FileNotFoundError(f"{index_path} names shards that are not there: {', '.join(absent)}")
        return files
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {model_dir} (load_format 'dummy' runs with random weights)"
        )
    return files


def _ignored(name: str, model: CausalLM) -> bool:
    """Tensors HF also skips: precomputed rotary frequencies, and the LM head when it is tied."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    return name == "lm_head.weight" and model.args.tie_word_embeddings


def _check_names(present: set[str], expected: set[str], model_dir: str) -> None:
    unknown, missing = sorted(present - expected), sorted(expected - present)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensor(s): {_some(missing)}")
    if unknown:
        problems.append(f"{len(unknown)} unexpected tensor(s): {_some(unknown)}")
    if problems:
        raise ValueError(f"the checkpoint in {model_dir} does not match its config.json: " + "; ".join(problems))


def _some(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def _tensor_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)


__all__ = ["checkpoint_params", "load_dummy_weights", "load_gguf_weights", "load_model", "load_safetensors_weights", "load_tensor"]
