"""A GGUF file's tensors as Hugging Face checkpoint tensors: renamed, dequantized (or kept in their blocks),
and un-permuted.

Each tensor is dequantized to float32 on load with the `gguf` package (numpy) from the file's memory map and
handed to the loader under its HF name; those the loader keeps quantized (`--quantization gguf`) arrive as
their blocks instead (a copy of the file's bytes, one row of blocks per output row). llama.cpp's converter reorders the rows of a Llama model's q and k
projections (per head, it interleaves the two rotary halves for its own RoPE layout); the reverse reordering
here restores HF's rotate-half layout (for blocks too: a block row is one output row). Qwen2 and Qwen3 files are stored unpermuted. A tensor type this
module has not been tested with is refused before any weight is read, naming the type and the tensor.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from engine.models.gguf_config import check_tensor_types
from engine.layers.quantized import QuantizedSource
from engine.models.gguf_file import TensorInfo, read_gguf

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for a tensor we do not map."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"
    return None


def gguf_checkpoint(path: str, keep_blocks: frozenset[str] = frozenset()):
    """(HF name, float32 tensor) for each tensor of the GGUF file, q/k rows restored to HF's order; for the
    GGUF names in keep_blocks, (HF name, QuantizedSource) instead."""
    gguf = read_gguf(path)
    check_tensor_types(gguf)
    arch = gguf.metadata["general.architecture"]
    heads = int(gguf.metadata[f"{arch}.attention.head_count"])
    kv_heads = int(gguf.metadata.get(f"{arch}.attention.head_count_kv") or heads)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in gguf.tensors.items():
        target = hf_name(name)
        if target is None:
            raise ValueError(f"{path}: tensor {name} has no counterpart in the {arch} decoder")
        if name in keep_blocks:
            raw = torch.from_numpy(np.array(data[info.offset:info.offset + info.nbytes]).reshape(info.shape[0], -1))
            tensor = raw
        else:
            tensor = dequantize(data, info)
        if arch == "llama" and ".attn_q." in name:
            tensor = unpermute_rotary_rows(tensor, heads)
        elif arch == "llama" and ".attn_k." in name:
            tensor = unpermute_rotary_rows(tensor, kv_heads)
        yield target, (QuantizedSource(info.type_id, tensor.contiguous(), info.shape[1]) if name in keep_blocks
                       else tensor)


def dequantize(data: np.ndarray, info: TensorInfo) -> torch.Tensor:
    """The tensor's values as float32 in its PyTorch shape."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    raw = data[info.offset:info.offset + info.nbytes]
    rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
    values = gguf_dequantize(raw.reshape(rows, -1), GGMLQuantizationType(info.type_id))
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(info.shape))   # a copy: the map is read-only


def unpermute_rotary_rows(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row order (pairs interleaved) for HF's (first half, second half) order."""
    shape = tensor.shape
    half = shape[0] // heads // 2
    return tensor.reshape(heads, half, 2, *shape[1:]).transpose(1, 2).reshape(shape)
