"""Review F4: the sampler's GPU path makes no host sync. Without a GPU, that path is forced on CPU tensors
(Sampler(sync_free=True)) while every operation that would read a device value back to the host raises:
the Tensor methods that do it, and, below them, the aten ops (a scalar read, nonzero, boolean-mask
indexing) that any other route to a read goes through. Also: the sync-free weights equal the CPU path's,
and the step's small host arrays reach the CPU device without a copy."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.sample.sampler import NUCLEUS_GUESS, Sampler, exp_weights
from engine.sample.sampling_batch import SamplingBatch
from engine.sample.transfer import to_device
from engine.sampling_params import SamplingParams
from tests.engine.sample.sampling_stats import (
    reference_distribution,
    single_torch_thread,  # noqa: F401  (autouse fixture)
)

aten = torch.ops.aten


class HostSync(AssertionError):
    pass


# Tensor methods that read values on the host. __len__ is refused outright: the sync-free path takes sizes
# from .shape, so a len() there could only be of a data-dependent result.
_SYNCING_METHODS = ("item", "cpu", "tolist", "numpy", "nonzero", "__bool__", "__len__", "__array__", "__int__",
                    "__float__", "__index__", "__iter__")
# aten ops that make the host wait for the device: a scalar read (item, bool, int, float all come here) or
# an output whose size depends on the data.
_SYNCING_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.is_nonzero, aten.equal,
                aten.unique_consecutive, aten._unique2, aten.unique_dim, aten.repeat_interleave}
_INDEXING_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


class _RefuseSyncingOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if packet in _SYNCING_OPS:
            raise HostSync(f"{func} syncs with the host")
        if packet in _INDEXING_OPS and any(index is not None and index.dtype in (torch.bool, torch.uint8)
                                           for index in args[1]):
            raise HostSync(f"{func} with a boolean mask syncs with the host")
        return func(*args, **(kwargs or {}))


def _refuse(name):
    def refuse(*args, **kwargs):
        raise HostSync(f"{name} syncs with the host")
    return refuse


@contextmanager
def no_host_syncs(monkeypatch):
    with monkeypatch.context() as patch:
        for name in _SYNCING_METHODS:
            patch.setattr(torch.Tensor, name, _refuse(f"Tensor.{name}"))
        patch.setattr(torch, "nonzero", _refuse("torch.nonzero"))
        with _RefuseSyncingOps():
            yield


def test_the_guard_catches_each_kind_of_sync(monkeypatch):
    x = torch.tensor([0.0, 1.0, 2.0])
    reads = [lambda: x.sum().item(), lambda: bool(x.any()), lambda: int(x.argmax()), lambda: float(x[0]),
             lambda: x.tolist(), lambda: x.cpu(), lambda: np.asarray(x), lambda: x.nonzero(),
             lambda: torch.nonzero(x), lambda: x[x > 0], lambda: x.masked_select(x > 0),
             lambda: x.index_put_((x > 0,), torch.tensor(5.0)), lambda: len(x), lambda: x.numpy()]
    with no_host_syncs(monkeypatch):
        for read in reads:
            with pytest.raises(HostSync):
                read()
        assert x.shape[0] == 3 and torch.where(x > 0, x, 0.0).sum(0).shape == ()    # shapes and masks stay free
    assert x.tolist() == [0.0, 1.0, 2.0]                                           # and the patches are undone


VOCAB = 20_000            # several sort segments, a padded last one, a ragged last vocabulary block
PEAKED, FLAT = 6.0, 0.2   # logit scales: a nucleus of a few tokens / of thousands


def _mixed_batch(extra: str, seed: int = 0):
    """Top-p rows whose nucleus fits among the candidates and rows whose nucleus is far larger, plus `extra`
    rows in the same batch; the logits and the params of each row."""
    rng = np.random.default_rng(seed)
    rows = [(PEAKED, SamplingParams(temperature=1.0, top_p=0.9)),
            (FLAT, SamplingParams(temperature=1.0, top_p=0.5)),
            (FLAT, SamplingParams(temperature=0.7, top_p=0.05, seed=7)),
            (PEAKED, SamplingParams(temperature=0.8, top_p=0.95, seed=3)),
            (FLAT, SamplingParams(temperature=1.0)),                                  # no top-p, same group
            (FLAT, SamplingParams(temperature=1.0, top_p=0.999))]
    if extra in ("min_p", "all"):
        rows += [(FLAT, SamplingParams(temperature=1.0, top_p=0.3, min_p=0.5)),
                 (PEAKED, SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05))]
    if extra in ("top_k_greedy", "all"):
        rows += [(FLAT, SamplingParams(temperature=1.0, top_k=50, top_p=0.5)),
                 (PEAKED, SamplingParams(temperature=0.0)), (FLAT, SamplingParams(temperature=1.0, top_k=5))]
    logits = np.stack([rng.normal(size=VOCAB).astype(np.float32) * scale for scale, _ in rows])
    batch = SamplingBatch(len(rows), VOCAB, torch.device("cpu"), seed=seed)
    for row, (_, params) in enumerate(rows):
        batch.add_request(row, params.resolved(), [0], [], [VOCAB - 1])
    return logits, [params for _, params in rows], batch.metadata(np.arange(len(rows)))


def _support(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    p = params.resolved()
    if p.temperature == 0.0:
        support = np.zeros(len(logits), bool)
        support[logits.argmax()] = True
        return support
    return reference_distribution(logits, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                  min_p=p.min_p) > 0


@pytest.mark.parametrize("extra", ["none", "min_p", "top_k_greedy", "all"])
def test_sync_free_path_makes_no_host_sync(monkeypatch, extra):
    logits, params, md = _mixed_batch(extra)
    nucleus_sizes = [int(_support(row, p).sum()) for row, p in zip(logits, params, strict=True)]
    assert nucleus_sizes[0] < NUCLEUS_GUESS < nucleus_sizes[1]          # both kinds of top-p row are there
    with no_host_syncs(monkeypatch):
        tokens = Sampler(sync_free=True)(torch.from_numpy(logits), md).sampled_token_ids
    for row, (token, p) in enumerate(zip(tokens.tolist(), params, strict=True)):
        assert _support(logits[row], p)[token], (row, p)
    # The CPU path, on the same batch, reads values on the host: the guard has the power to notice.
    with no_host_syncs(monkeypatch), pytest.raises(HostSync):
        Sampler(sync_free=False)(torch.from_numpy(logits), md)


@pytest.mark.parametrize("low", [0.5, -3.0, -200.0])      # none below the floor; some; some below exp's range
def test_sync_free_weights_equal_the_cpu_path(low):
    gen = torch.Generator().manual_seed(1)
    log_weights = torch.rand(6, 1000, generator=gen) * 30 + low
    log_weights[0, :5] = torch.tensor([0.0, -1e-7, 1e-7, -87.5, 70.0])
    skipped = exp_weights(log_weights.clone(), skip_unneeded_passes=True)
    always = exp_weights(log_weights.clone(), skip_unneeded_passes=False)
    assert torch.equal(skipped, always)
    assert bool(((always == 0) | (always >= 1)).all())               # every weight dropped or kept at >= 1
    assert torch.equal(always == 0, log_weights < 0)


def test_host_arrays_reach_the_cpu_device_without_a_copy():
    array = np.arange(5, dtype=np.int64)
    tensor = to_device(array, torch.device("cpu"))
    assert tensor.data_ptr() == array.ctypes.data and tensor.tolist() == [0, 1, 2, 3, 4]
    strided = np.arange(10, dtype=np.int64)[::2]
    assert to_device(strided, torch.device("cpu")).tolist() == [0, 2, 4, 6, 8]
