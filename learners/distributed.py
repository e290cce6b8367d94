"""The learners' torch.distributed world: set-up, the per-iteration agreement, teardown.

Every loop iteration all ranks join one small all-reduce that says whether each has a batch and
whether any must stop. An update runs only when every rank has a batch, so no rank ever waits in
a DDP backward for a peer that has nothing to train on; a stop seen by one rank stops all of them
at the same iteration.
"""

from __future__ import annotations

import datetime
from typing import NamedTuple

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def init_world(rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device) -> None:
    """NCCL on GPUs, gloo on CPUs; a TCP store at rank 0's address."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )


class Agreement(NamedTuple):
    everyone_has_batch: bool
    stop: bool
    samples: int  # env steps in this iteration's batches, summed over ranks


def agree(has_batch: bool, stop: bool, samples: int, device: torch.device) -> Agreement:
    flags = torch.tensor([int(has_batch), int(stop), samples], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    has, stops, total = (int(v) for v in flags.tolist())
    world = dist.get_world_size()
    return Agreement(everyone_has_batch=has == world, stop=stops > 0, samples=total if has == world else 0)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
