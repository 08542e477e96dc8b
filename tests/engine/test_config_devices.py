"""Device-dependent configuration, checked on the CPU by standing in for torch's view of the GPUs: the
Triton head_dim check (review F1), tensor parallelism against the visible GPUs (F7), and the test suite's
own CPU pinning on a GPU host (F2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine.config
from engine.config import EngineConfig
from engine.errors import ConfigError
from tests import conftest
from tests.engine.hf_models import BASE_CONFIG

TESTS = Path(__file__).resolve().parents[1]


def _model_dir(tmp_path: Path, **overrides) -> str:
    config = {**BASE_CONFIG, "architectures": ["LlamaForCausalLM"], "model_type": "llama", **overrides}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture(autouse=True)
def _triton_found(monkeypatch):
    """Config resolution only asks whether triton could be imported: say yes, as on a GPU host."""
    real_find_spec = engine.config.importlib.util.find_spec
    monkeypatch.setattr(engine.config.importlib.util, "find_spec",
                        lambda name, *args: real_find_spec("json") if name == "triton" else real_find_spec(name, *args))


@pytest.fixture
def gpus(monkeypatch):
    """Pretend torch sees `n` CUDA GPUs (config resolution only: nothing touches a device here)."""
    def pretend(n: int) -> None:
        monkeypatch.setattr(engine.config, "cuda_available", lambda: n > 0)
        monkeypatch.setattr(engine.config, "cuda_device_count", lambda: n)
    return pretend


def test_config_head_dims_are_the_kernels_head_dims():
    tiles = pytest.importorskip("kernels.triton_attention_tiles", reason=conftest.TRITON_MISSING)
    assert engine.config.TRITON_HEAD_DIMS == tiles.SUPPORTED_HEAD_DIMS


def test_a_gpu_without_triton_is_a_config_error_that_says_what_to_install(tmp_path, gpus, monkeypatch):
    gpus(1)
    found = engine.config.importlib.util.find_spec
    monkeypatch.setattr(engine.config.importlib.util, "find_spec",
                        lambda name, *args: None if name == "triton" else found(name, *args))
    with pytest.raises(ConfigError, match=r"needs triton.*pip install 'ringserve\[gpu\]'"):
        EngineConfig(model=_model_dir(tmp_path)).finalize()
    assert EngineConfig(model=_model_dir(tmp_path), attention_backend="torch").finalize().resolved_device == "cuda"


def test_head_dim_16_models_run_on_cuda(tmp_path, gpus):
    gpus(1)
    config = EngineConfig(model=_model_dir(tmp_path)).finalize()          # hidden 64 / 4 heads
    assert (config.resolved_device, config.max_num_batched_tokens) == ("cuda", 8192)


def test_unsupported_head_dim_fails_in_the_config_not_in_the_executor(tmp_path, gpus):
    gpus(1)
    path = _model_dir(tmp_path, hidden_size=32)                            # head_dim 8
    with pytest.raises(ConfigError, match="head_dim 8 is not supported by the triton attention backend"):
        EngineConfig(model=path).finalize()
    assert EngineConfig(model=path, attention_backend="torch").finalize().resolved_device == "cuda"
    with pytest.raises(ConfigError, match="head_dim 8"):
        EngineConfig(model=path, device="cpu", attention_backend="triton").finalize()


def test_tensor_parallel_size_beyond_the_visible_gpus_is_a_config_error(tmp_path, gpus):
    gpus(1)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2 needs 2 GPUs .* torch sees 1"):
        EngineConfig(model=_model_dir(tmp_path), tensor_parallel_size=2).finalize()
    gpus(2)
    assert EngineConfig(model=_model_dir(tmp_path), tensor_parallel_size=2).finalize().resolved_device == "cuda"
    gpus(1)     # on the CPU (gloo) any size goes
    assert EngineConfig(model=_model_dir(tmp_path), tensor_parallel_size=2, device="cpu").finalize()


def test_the_default_suite_sees_a_cpu_machine_on_a_gpu_host(tmp_path, monkeypatch):
    # torch sees a GPU: device "auto" follows it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(engine.config, "cuda_available", engine.config.cuda_available)   # undone after the test
    path = _model_dir(tmp_path)
    assert EngineConfig(model=path).finalize().resolved_device == "cuda"
    # what tests/conftest.py does at import on a CUDA host
    environ: dict[str, str] = {}
    conftest.pin_cpu_semantics(environ, engine.config)
    config = EngineConfig(model=path).finalize()
    assert config.resolved_device == "cpu"
    assert environ == {"CUDA_VISIBLE_DEVICES": ""}                         # children see no GPU either


def test_markers_decide_where_a_test_runs():
    assert conftest.skip_reason({"gpu"}, has_cuda=False) == "needs a CUDA GPU"
    assert conftest.skip_reason({"gpu"}, has_cuda=True) is None
    assert "interpreter" in conftest.skip_reason({"interpreter"}, has_cuda=True)
    assert conftest.skip_reason({"interpreter"}, has_cuda=False) is None
    assert conftest.skip_reason(set(), has_cuda=True) is None
    assert "triton is not installed" in conftest.skip_reason({"interpreter"}, has_cuda=False, has_triton=False)


# modules that name Triton kernels but never hand them CPU tensors in this process: compile-only
# subprocesses, shape functions only, or this check itself
COMPILE_ONLY = {"kernels/test_sm90_compile.py", "kernels/test_triton_specialisation.py", "test_layers.py",
                "engine/executor/test_kernel_warmup.py", "engine/test_config_devices.py"}


def test_every_test_module_that_runs_triton_on_cpu_tensors_is_marked():
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        name = path.relative_to(TESTS).as_posix()
        source = path.read_text()
        runs_triton = "kernels.triton_" in source or "triton_backend" in source
        marked = "pytest.mark.interpreter" in source or "pytest.mark.gpu" in source
        if runs_triton and not marked and name not in COMPILE_ONLY:
            unmarked.append(name)
    assert unmarked == []


def test_a_float16_model_stays_16_bit_on_a_cpu_with_the_avx2_kernels(tmp_path, monkeypatch):
    """dtype auto: a float16 model (every quantized GGUF declares float16) keeps 16-bit weights on a CPU
    where kernels/cpu/ops can run (fast, float32 arithmetic), and is widened to float32 where they cannot."""
    model = _model_dir(tmp_path, torch_dtype="float16")
    monkeypatch.setattr(engine.config, "cpu_half_kernels_possible", lambda: True)
    assert EngineConfig(model=model, device="cpu").finalize().resolved_dtype == "float16"
    monkeypatch.setattr(engine.config, "cpu_half_kernels_possible", lambda: False)
    assert EngineConfig(model=model, device="cpu").finalize().resolved_dtype == "float32"
    assert EngineConfig(model=model, device="cpu", dtype="float16").finalize().resolved_dtype == "float16"


def test_cpu_half_kernels_possible_agrees_with_the_kernels(monkeypatch):
    from kernels.cpu import ops as cpu_ops

    assert engine.config.cpu_half_kernels_possible() == cpu_ops.available()
    monkeypatch.setenv("RINGSERVE_CPU_KERNELS", "0")
    assert not engine.config.cpu_half_kernels_possible()
