"""Which of a GGUF file's tensors stay in their quantized blocks (`--quantization gguf`), and what the loaded
weights take in memory.

A layer keeps its weight quantized when every checkpoint tensor it fuses is of a type with a kernel
(kernels/gguf_blocks.QUANT_TYPES), the layer can take blocks (a matmul layer or the token embedding; a
row-parallel split must fall on block boundaries) and the kernels run on the device (kernels/cpu/quant on a
CPU with AVX2 and a C compiler, Triton on CUDA). Everything else is dequantized as with `--quantization
none`, and the startup log says once which tensors and why.
"""

from __future__ import annotations

import logging

import torch

from engine.layers.quantized import QuantizedMatmul
from engine.models.gguf_file import GGML_TYPES, GGUFFile
from kernels import use_triton
from kernels.cpu import quant as cpu_quant
from kernels.gguf_blocks import QUANT_TYPES

logger = logging.getLogger(__name__)
FLOAT_TYPES = ("F32", "F16", "BF16")


def kernels_run_on(device: torch.device) -> str | None:
    """Why quantized kernels cannot run on `device`, or None when they can."""
    if device.type == "cuda":
        return None if use_triton(torch.empty(0, device=device)) else "Triton is not available"
    return None if cpu_quant.available() else "no quantized CPU kernels here (they need x86 AVX2 and a C compiler)"


def plan_quantized(gguf: GGUFFile, names: dict[str, str], params: dict, device: torch.device) -> set[str]:
    """The HF names (of `names`: HF name -> GGUF name) whose tensors load as blocks; logs the others that
    the file holds quantized."""
    by_layer: dict[object, list[str]] = {}
    for hf, (module, param, _) in params.items():
        if hf in names and param is getattr(module, "weight", None):
            by_layer.setdefault(module, []).append(hf)
    device_reason = kernels_run_on(device)
    kept: set[str] = set()
    fallbacks: dict[str, list[str]] = {}
    for module, hfs in by_layer.items():
        types = [gguf.tensors[names[hf]].type_id for hf in hfs]
        if all(GGML_TYPES[t][0] in FLOAT_TYPES for t in types):
            continue
        if device_reason is not None:
            reason = device_reason
        elif not isinstance(module, QuantizedMatmul):
            reason = "this layer has no quantized path"
        elif any(t not in QUANT_TYPES for t in types):
            reason = "a type without a kernel (or fused with one)"
        elif not all(module.takes_blocks(QUANT_TYPES[t][1]) for t in types):
            reason = "its tensor-parallel split does not fall on block boundaries"
        else:
            kept.update(hfs)
            continue
        fallbacks.setdefault(reason, []).extend(
            f"{names[hf]} ({GGML_TYPES[t][0]})" for hf, t in zip(hfs, types, strict=True))
    for reason, tensors in fallbacks.items():
        shown = ", ".join(tensors[:4]) + (f" and {len(tensors) - 4} more" if len(tensors) > 4 else "")
        logger.warning("GGUF tensors dequantized at load, %s: %s", reason, shown)
    return kept


def weight_bytes_by_type(model: torch.nn.Module) -> dict[str, int]:
    """Bytes the model's weights take, by GGUF block type (quantized weights) or torch dtype (the rest);
    tied weights count once."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def add(kind: str, count: int) -> None:
        sizes[kind] = sizes.get(kind, 0) + count

    for module in model.modules():
        qweight = getattr(module, "qweight", None)
        if qweight is not None and id(qweight) not in seen:
            seen.add(id(qweight))
            for kind, count in qweight.bytes_by_type().items():
                add(kind, count)
    for param in model.parameters():
        if param.numel() and param.data_ptr() not in seen:
            seen.add(param.data_ptr())
            add(str(param.dtype).removeprefix("torch."), param.numel() * param.element_size())
    return sizes
