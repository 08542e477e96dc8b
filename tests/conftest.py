"""Shared test fixtures and marker handling.

`gpu` tests are skipped without CUDA; `slow` tests are deselected by default (pyproject's addopts).
Tests that need ../shared (real tokenizers and configs) skip cleanly when it is absent. Without CUDA the
Triton kernels run under Triton's interpreter, which must be chosen before any kernel module is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RINGSERVE_SHARED", REPO.parent / "shared"))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test when it is not there."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared is optional)")
    return path
