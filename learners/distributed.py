"""The learners' torch.distributed world: set-up, the per-iteration agreement, teardown.

Every loop iteration all ranks join one small all-reduce that says whether each is ready to
update, whether any must stop, how much data each member has, and whether rank 0 has a PBT decision
to hand out. An update runs only when every rank is ready, so no rank ever waits in a DDP backward
for a peer that has nothing to train on; a stop seen by one rank stops all of them, and a decision
is applied by all of them, at the same iteration.
"""

from __future__ import annotations

import datetime
import socket
import zlib
from typing import NamedTuple

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


class Placement(NamedTuple):
    """What one rank tells the others before any of them picks a device."""

    host: int  # crc32 of the host name: ranks with equal values share a machine
    gpus: int  # CUDA devices this rank can see


def choose_device(requested: str, rank: int, placements: list[Placement]) -> torch.device:
    """This rank's device, decided from every rank's placement (the same table on all ranks, so
    all decide alike). NCCL needs one GPU per rank: "cuda" gives the n-th rank on a host its n-th
    GPU; "auto" does the same when every host has a GPU for each of its ranks, else every rank
    trains on the CPU (one backend for the whole world); "cuda:N" is taken as given."""
    on_host = [r for r, p in enumerate(placements) if p.host == placements[rank].host]
    short = [p for p in placements if p.gpus < sum(q.host == p.host for q in placements)]
    if requested == "auto":
        return torch.device("cpu") if short else torch.device("cuda", on_host.index(rank))
    if requested == "cuda":
        if short:
            raise RuntimeError(
                f"--device cuda: {sum(q.host == short[0].host for q in placements)} learner ranks share a "
                f"host with {short[0].gpus} GPU(s), and NCCL needs one GPU per rank; run at most "
                f"{short[0].gpus} learner(s) per host, or --device cpu (RLMQ_DEVICE=cpu)"
            )
        return torch.device("cuda", on_host.index(rank))
    return torch.device(requested)


def init_world(rank: int, world_size: int, master_addr: str, master_port: int, requested: str) -> torch.device:
    """Joins the world over a TCP store at rank 0's address and returns this rank's device (see
    `choose_device`). CPU tensors go over gloo and CUDA tensors over NCCL, whose communicator
    is made lazily at the first CUDA collective, so the ranks can first agree over gloo on where
    each one trains."""
    cuda = requested != "cpu" and torch.cuda.is_available()
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    mine = torch.tensor([zlib.crc32(socket.gethostname().encode()), torch.cuda.device_count() if cuda else 0])
    table = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(table, mine)
    device = choose_device(requested, rank, [Placement(*(int(v) for v in t)) for t in table])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


class Agreement(NamedTuple):
    everyone_ready: bool
    stop: bool
    member_samples: list[int]  # env steps in each member's batches this iteration, summed over ranks
    decision_bytes: int  # length of the PBT decision rank 0 hands out this iteration; 0: none


def agree(ready: bool, stop: bool, member_samples: list[int], decision_bytes: int,
          device: torch.device) -> Agreement:  # fmt: skip
    """One all-reduce per iteration. Only rank 0 offers a decision, so the sum is its length."""
    if dist.get_world_size() == 1:  # nothing to agree with: skip the collective
        return Agreement(ready, stop, list(member_samples), decision_bytes)
    flags = torch.tensor([int(ready), int(stop), decision_bytes, *member_samples], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    ready_ranks, stops, length, *samples = (int(v) for v in flags.tolist())
    return Agreement(ready_ranks == dist.get_world_size(), stops > 0, samples, length)


def share_any_length(frame: bytes, device: torch.device) -> bytes:
    """Rank 0's `frame` on every rank, its length unknown to the others."""
    length = torch.tensor([len(frame)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    return share(frame, int(length.item()), device)


def share(frame: bytes, length: int, device: torch.device) -> bytes:
    """Rank 0's `frame` (`length` bytes) on every rank: a broadcast of raw bytes, never pickle
    (torch's broadcast_object_list would unpickle whatever arrives)."""
    buffer = torch.zeros(length, dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        buffer.copy_(torch.frombuffer(bytearray(frame), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().numpy())


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
