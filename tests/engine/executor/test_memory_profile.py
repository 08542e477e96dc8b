"""Review F8, the CPU-visible part: the memory profile's dummy sampler pass grows the sampler's [rows, V]
workspaces to max_num_seqs rows before the KV cache is sized (on CUDA they then count in the measured
peak and stay allocated), without touching the real sampling batch's random stream. The CUDA arithmetic
(peak, non-torch memory, graph-pool estimate) needs a GPU and is not checked here."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.executor.model_runner import ModelRunner
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401  (the tiny_model fixture)


def test_dummy_sample_grows_the_sampler_workspaces_to_the_worst_case(tiny_model):
    config = EngineConfig(model=str(tiny_model("LlamaForCausalLM")), device="cpu", max_num_seqs=8).finalize()
    runner = ModelRunner(config)
    runner.load()
    state = runner.sampling.generator.bit_generator.state
    sampler = runner.sampler
    assert all(w._buffer is None for w in (sampler._weights, sampler._raw))
    runner._dummy_sample(config.max_num_seqs)
    rows_by_vocab = config.max_num_seqs * config.vocab_size
    assert sampler._weights._buffer.numel() >= rows_by_vocab       # full-vocabulary weights (top-p rows)
    assert sampler._raw._buffer.numel() >= rows_by_vocab           # raw logits kept for logprobs
    assert runner.sampling.generator.bit_generator.state == state


def test_cpu_runner_draws_plain_rows_with_the_c_kernel_where_it_runs(tiny_model):
    """The executor gives its sampler kernels/cpu/ops's one-pass draw for rows without top-k/top-p on a CPU
    where the kernels run (tests/engine/sample checks that it draws the torch path's tokens)."""
    from kernels.cpu import ops as cpu_ops

    config = EngineConfig(model=str(tiny_model("LlamaForCausalLM")), device="cpu", max_num_seqs=4).finalize()
    runner = ModelRunner(config)
    runner.load()
    expected = cpu_ops.sample_exp_rows if cpu_ops.available() else None
    assert runner.sampler.full_row_draw is expected
