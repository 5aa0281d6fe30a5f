"""Process-group setup for ``torchrun``: gloo on CPU, nccl on CUDA; a single process needs none of it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import TrainingError

DEVICES = ("auto", "cpu", "cuda")  # "auto": CUDA when available


@dataclass
class Distributed:
    """Where this process stands: ``rank`` of ``world_size``; ``is_main`` logs and writes files."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over all processes (a copy; detached)."""
        values = values.detach().clone().to(self.device)
        if self.enabled:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup(device: str = "auto") -> Distributed:
    """Join the process group torchrun describes (``WORLD_SIZE``/``RANK``/``LOCAL_RANK``), if any."""
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise TrainingError("--device cuda: no CUDA device is available; use --device cpu")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(device=torch.device("cuda" if use_cuda else "cpu"))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Distributed(rank, world_size, torch.device(f"cuda:{local_rank}" if use_cuda else "cpu"))


def teardown(distributed: Distributed) -> None:
    if distributed.enabled and dist.is_initialized():
        dist.destroy_process_group()
