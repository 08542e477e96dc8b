"""A --models-dir for the end-to-end tests: GGUF files (the bundled SmolLM2 under two names), directory models
(the built-in demo under two names; the qwen3-tiny shape with dummy weights and the real Qwen3 tokenizer,
set up by its settings file), and a directory-wide settings file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.models.bundled import find_smollm2
from engine.models.demo import ensure_demo_model
from tests.conftest import SHARED


def make_models_dir(root: Path, *, gguf: bool = True, demo: bool = True, qwen3: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tables = ""
    if gguf and find_smollm2() is not None:
        os.symlink(find_smollm2(), root / "smol.gguf")
        os.symlink(find_smollm2(), root / "smol-b.gguf")
        (root / "smol.toml").write_text("max_model_len = 2048\n")        # beside the file: its own settings
        tables += "[smol-b]\nmax_model_len = 2048\n"                      # the directory file's table for one
    if demo:
        shutil.copytree(ensure_demo_model(), root / "demo-a")
        os.symlink(root / "demo-a", root / "demo-b")
    tiny, tokenizer = SHARED / "models/configs/qwen3-tiny", SHARED / "models/tokenizers/qwen3"
    if qwen3 and tiny.is_dir() and tokenizer.is_dir():
        shutil.copytree(tiny, root / "qwen3-tiny")
        (root / "qwen3-tiny" / "ringserve.toml").write_text(
            f'load_format = "dummy"\ntokenizer = "{tokenizer}"\nmax_model_len = 1024\ntemperature = 0.0\n')
    # every model's KV cache small (the directory's file), and one model's table in it
    if demo:
        tables += "[demo-b]\nmax_num_seqs = 8\n"
    (root / "models.toml").write_text(f"kv_cache_memory = 67108864\n\n{tables}")
    return root
