"""The tensor-parallel group: a thin layer over torch.distributed (gloo on the CPU, NCCL on CUDA).

One process per rank; every rank calls `init_tensor_parallel` once before building its model shard. At
tp = 1 no process group exists and the collectives return their input, so single-device code pays nothing.
On CUDA the caller selects the rank's device (torch.cuda.set_device) before initialising.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

_rank = 0
_world_size = 1


def init_tensor_parallel(
    rank: int,
    world_size: int,
    init_method: str | None = None,
    backend: str | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Join the tensor-parallel group as `rank` of `world_size`.

    init_method is torch.distributed's rendezvous address (e.g. "tcp://127.0.0.1:29500"); backend defaults
    to nccl when CUDA is available and gloo otherwise. The timeout bounds the rendezvous and every
    collective, so a dead peer is an error rather than a hang.
    """
    global _rank, _world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"tensor-parallel rank {rank} is outside a group of size {world_size}")
    if _world_size > 1 or dist.is_initialized():
        raise RuntimeError("the tensor-parallel group is already initialised in this process")
    if world_size > 1:
        if init_method is None:
            raise ValueError("init_method (e.g. tcp://127.0.0.1:PORT) is needed when world_size > 1")
        dist.init_process_group(
            backend or ("nccl" if torch.cuda.is_available() else "gloo"),
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    _rank, _world_size = rank, world_size


def destroy_tensor_parallel() -> None:
    """Leave the group (if any) so the process can exit cleanly or join a new one."""
    global _rank, _world_size
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank, _world_size = 0, 1


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _world_size


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over the ranks, in place; returns it."""
    if _world_size == 1:
        return tensor
    dist.all_reduce(tensor)
    return tensor


def all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `tensor` along `dim`, in rank order (a new tensor on every rank)."""
    if _world_size == 1:
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(_world_size)]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=dim)
