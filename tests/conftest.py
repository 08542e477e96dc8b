"""Shared test fixtures and marker handling.

`gpu` tests are skipped without CUDA; `slow` tests are deselected by default (pyproject's addopts).
Tests that need ../shared (real tokenizers and configs) skip cleanly when it is absent.

The default suite pins CPU semantics on any host, so it passes on a CPU machine and a GPU machine alike:
- Without CUDA the Triton kernels run under Triton's interpreter, which must be chosen before any kernel
  module is imported. With CUDA it cannot be (the `gpu` tests need compiled kernels in the same process),
  so `interpreter` tests skip there; `CUDA_VISIBLE_DEVICES= pytest tests/kernels` runs them (tools.gpu_check
  does).
- With CUDA, every test but the `gpu` ones sees a CPU-only machine: device "auto" resolves to the CPU in
  this process (engine.config.cuda_available is pinned) and in every child it spawns (CUDA_VISIBLE_DEVICES
  is emptied after this process has counted its GPUs). The `gpu` tests get both back.
"""

from __future__ import annotations

import importlib.util
import os
import re
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


def pin_cpu_semantics(environ, config_module) -> None:
    """Make `environ`'s children and `config_module`'s device "auto" see no GPU."""
    environ["CUDA_VISIBLE_DEVICES"] = ""
    config_module.cuda_available = _no_cuda


def _no_cuda() -> bool:
    return False


def skip_reason(keywords, has_cuda: bool, has_triton: bool = True) -> str | None:
    """Why a test with these markers cannot run on this host, or None."""
    if "gpu" in keywords and not has_cuda:
        return "needs a CUDA GPU"
    if "interpreter" in keywords and not has_triton:
        return TRITON_MISSING
    if "interpreter" in keywords and has_cuda:
        return ("runs Triton's interpreter on CPU tensors, which a CUDA host's compiled kernels refuse; "
                "run CUDA_VISIBLE_DEVICES= pytest tests/kernels")
    return None


HAS_CUDA = _has_cuda()
HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_MISSING = "triton is not installed (the default install leaves it out; '.[test]' and '.[gpu]' bring it)"
_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")
if HAS_CUDA:
    import engine.config

    _REAL_CUDA_AVAILABLE = engine.config.cuda_available
    pin_cpu_semantics(os.environ, engine.config)
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _gpu_tests_see_the_gpu(request, monkeypatch):
    """Undo pin_cpu_semantics for the `gpu` tests (function scope: they build their engines themselves)."""
    if HAS_CUDA and "gpu" in request.keywords:
        import engine.config

        monkeypatch.setattr(engine.config, "cuda_available", _REAL_CUDA_AVAILABLE)
        if _VISIBLE_DEVICES is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", _VISIBLE_DEVICES)
    yield


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = skip_reason(item.keywords, HAS_CUDA, HAS_TRITON)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# a test module that imports triton (or a Triton kernel) at its top needs it to be collected at all
_IMPORTS_TRITON = re.compile(r"^(?:import triton|from (?:triton|kernels\.triton_\w+|engine\.attention\.triton_backend)"
                             r" import)", re.M)


class _NeedsTriton(pytest.File):
    """Stands in for a test module that cannot be imported without triton: one test that skips, saying why."""

    def collect(self):
        yield _TritonMissing.from_parent(self, name="needs_triton")


class _TritonMissing(pytest.Item):
    def runtest(self) -> None:
        pytest.skip(f"{self.path.name}: {TRITON_MISSING}")

    def reportinfo(self):
        return self.path, None, self.name


def pytest_pycollect_makemodule(module_path, parent):
    if not HAS_TRITON and _IMPORTS_TRITON.search(module_path.read_text()):
        return _NeedsTriton.from_parent(parent, path=module_path)
    return None


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test when it is not there."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared is optional)")
    return path
