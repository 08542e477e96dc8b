"""Tensor parallelism: the collectives with and without a group, and tp = 2 over gloo on the CPU giving the
logits of tp = 1 on every rank (sharded and replicated KV heads, vocabulary not divisible by tp, biases on
row-parallel layers, a GGUF file's weights kept quantized)."""

from __future__ import annotations

import multiprocessing
import socket

import numpy as np
import pytest
import torch

from engine import distributed
from engine.config import EngineConfig
from engine.models.loader import load_model
from tests.engine.hf_models import PagedBatchRunner, tiny_model_fixture  # noqa: F401  (the tiny_model fixture)
from tests.engine.models.gguf_files import gguf_model, hf_dirs  # noqa: F401  (their fixtures)

PROMPTS = {"a": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], "b": [2, 7, 1, 8], "c": [100, 200]}
DECODE_TOKENS = [[10, 20, 30], [11, 21, 31]]       # fixed, so that near-ties cannot change the inputs


def run_requests(model) -> np.ndarray:
    """A prefill batch then decode steps; every step's logits, stacked."""
    runner = PagedBatchRunner(model)
    steps = [torch.cat(list(runner.step(PROMPTS).values()))]
    for tokens in DECODE_TOKENS:
        logits = runner.step({req: [token] for req, token in zip(PROMPTS, tokens, strict=True)})
        steps.append(torch.cat(list(logits.values())))
    return torch.cat(steps).numpy()


def _worker(rank: int, world_size: int, port: int, model_dirs: list[str], out_dir: str) -> None:
    torch.set_num_threads(1)
    distributed.init_tensor_parallel(rank, world_size, f"tcp://127.0.0.1:{port}", "gloo", timeout_s=60)
    try:
        assert (distributed.tp_rank(), distributed.tp_size()) == (rank, world_size)
        summed = distributed.all_reduce(torch.full((3,), float(rank + 1)))
        gathered = distributed.all_gather(torch.full((2, 1), float(rank)), dim=1)
        np.save(f"{out_dir}/collectives_rank{rank}.npy", np.concatenate([summed.numpy(), gathered.ravel().numpy()]))
        for i, model_dir in enumerate(model_dirs):
            config = EngineConfig(model=model_dir, tensor_parallel_size=world_size, dtype="float32")
            model = load_model(config, device="cpu", tp_rank=rank, tp_size=world_size, progress=False)
            np.save(f"{out_dir}/model{i}_rank{rank}.npy", run_requests(model))
    finally:
        distributed.destroy_tensor_parallel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_collectives_are_identities_without_a_group():
    t = torch.arange(6.0).view(2, 3)
    assert (distributed.tp_rank(), distributed.tp_size()) == (0, 1)
    assert distributed.all_reduce(t) is t
    assert distributed.all_gather(t, dim=0) is t


def test_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 2 is outside a group of size 2"):
        distributed.init_tensor_parallel(2, 2, "tcp://127.0.0.1:1")


def test_tp2_over_gloo_matches_tp1(tiny_model, gguf_model, tmp_path):  # noqa: F811
    models = [
        # 2 KV heads: one per rank; tied embeddings; qkv bias.
        tiny_model("Qwen2ForCausalLM"),
        # 1 KV head: replicated on both ranks; 511 rows split 256 + 255 (+1 padding row);
        # o_proj and down_proj biases must be added once, after the all-reduce.
        tiny_model("LlamaForCausalLM", num_key_value_heads=1, vocab_size=511, attention_bias=True,
                   mlp_bias=True),
        # GGUF blocks kept quantized: row-parallel layers split on block boundaries, 263 vocabulary rows
        # split 132 + 131 (+1 all-zero padding row of blocks)
        gguf_model("LlamaForCausalLM", "Q8_0"),
    ]
    context = multiprocessing.get_context("spawn")
    port = _free_port()
    workers = [
        context.Process(target=_worker, args=(rank, 2, port, [str(m) for m in models], str(tmp_path)))
        for rank in range(2)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)                     # liveness bound, not a timing claim
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join()
    assert [w.exitcode for w in workers] == [0, 0]

    for rank in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"collectives_rank{rank}.npy"), [3, 3, 3, 0, 1, 0, 1])
    for i, path in enumerate(models):
        rank0, rank1 = (np.load(tmp_path / f"model{i}_rank{r}.npy") for r in range(2))
        np.testing.assert_array_equal(rank0, rank1)            # every rank holds the same full logits
        single = run_requests(load_model(EngineConfig(model=str(path), dtype="float32"), device="cpu", progress=False))
        assert rank0.shape == single.shape
        # quantized: a row-parallel rank rounds its half of the activations in the same 32-value blocks, but a
        # value near a rounding boundary may land on the other side after the float sums' different order
        tolerance = 1e-3 if str(path).endswith(".gguf") else 1e-4
        np.testing.assert_allclose(rank0, single, rtol=tolerance, atol=tolerance)


def test_executor_shutdown_leaves_the_process_group():
    # review F7: an executor must destroy its group before exiting (an NCCL group left alive warns at exit
    # and can hold the rank until the kill timeout); a one-rank gloo group stands in for NCCL here
    import torch.distributed as dist

    from engine.executor.main import _call
    from engine.messages import ExecutorCall

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        assert _call(None, ExecutorCall(call_id=1, method="shutdown")) == "bye"
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
