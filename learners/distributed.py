"""The learners' torch.distributed world: set-up, the per-iteration agreement, teardown.

Every loop iteration all ranks join one small all-gather (each rank reduces its rows alike) that
says whether each is ready to update (or overdue: it has waited too long for the others), whether
any must stop, how much data each member has, and whether rank 0 has a PBT decision to hand out.
An update runs when every rank is ready, or when one is overdue: every rank then runs it, those
without data on an empty batch, so no rank ever waits in a DDP backward its peers never run, and
no rank without data holds the others hostage. A stop seen by one rank stops all of them, and a
decision is applied by all of them, at the same iteration.
"""

from __future__ import annotations

import datetime
import os
import socket
import zlib
from typing import NamedTuple

import torch
import torch.distributed as dist

from rlmq.common.addresses import interface_of, is_loopback, loopback_interface

RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)  # ranks may start minutes apart (pods, images)


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


def init_world(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    requested: str,
    bind_host: str = "*",
    collective_timeout_s: float = 30.0,
    master_fd: int = -1,
    reached_at: str = "",
) -> torch.device:
    """Joins the world over a TCP store at rank 0's address and returns this rank's device (see
    `choose_device`). CPU tensors go over gloo and CUDA tensors over NCCL, whose communicator
    is made lazily at the first CUDA collective, so the ranks can first agree over gloo on where
    each one trains.

    Rank 0 serves the store on `master_fd` if a parent bound it (`rlmq up`), else on `bind_host`
    (torch's own store binds every interface). gloo and NCCL listen on the interface of a loopback
    `bind_host`, else on the one holding `reached_at`, the address this rank's peers reach it at
    (unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME say otherwise): left to themselves they take
    what the host name resolves to, 127.0.1.1 on a stock Debian, and the world never forms. The
    rendezvous waits up to RENDEZVOUS_TIMEOUT for every rank; each collective after it,
    `collective_timeout_s`."""
    interface = loopback_interface() if is_loopback(bind_host) else interface_of(reached_at)
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    if rank == 0 and (master_fd >= 0 or bind_host != "*"):
        if master_fd < 0:
            master_fd = socket.create_server((bind_host, master_port), backlog=world_size + 8).detach()
        store = dist.TCPStore(
            master_addr,
            master_port,
            world_size,
            True,
            RENDEZVOUS_TIMEOUT,
            multi_tenant=True,
            master_listen_fd=master_fd,
        )
    else:  # rank 0 on "*": torch's own server, every interface (IPv6 too)
        # multi_tenant as torch's own tcp:// rendezvous makes its store
        store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, RENDEZVOUS_TIMEOUT, multi_tenant=True)
    cuda = requested != "cpu" and torch.cuda.is_available()
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if cuda else "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=collective_timeout_s),
    )
    mine = torch.tensor([zlib.crc32(socket.gethostname().encode()), torch.cuda.device_count() if cuda else 0])
    table = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(table, mine)
    device = choose_device(requested, rank, [Placement(*(int(v) for v in t)) for t in table])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


LOST_WORLD_SIGNS = ("gloo/transport", "by peer", "connection reset", "broken pipe")


def lost_world(exc: BaseException) -> bool:
    """Whether `exc` says the world is gone (a peer rank died or is cut off, a collective or the
    store timed out), not that this rank's own code failed: torch raises DistError for most of
    these (NCCL's included), and gloo's transport a plain RuntimeError naming its source file
    (its timeouts too) or the peer."""
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and any(sign in str(exc).lower() for sign in LOST_WORLD_SIGNS)
    )


class Agreement(NamedTuple):
    update: bool  # every rank is ready, or one is overdue
    stop: bool
    member_samples: list[int]  # env steps in each member's batches this iteration, summed over ranks
    decision_bytes: int  # length of the PBT decision rank 0 hands out this iteration; 0: none
    checkpoint: bool  # every rank writes a checkpoint now (rank 0's clock says when)
    batch_rollouts: int  # rollouts per member in this update's batch: the most any rank takes


def agree(
    ready: bool,
    overdue: bool,
    stop: bool,
    member_samples: list[int],
    decision_bytes: int,
    checkpoint: bool,
    device: torch.device,
    batch_rollouts: int,
) -> Agreement:
    """`agreement` on this rank's `proposal` of these."""
    return agreement(proposal(ready, overdue, stop, member_samples, decision_bytes, checkpoint, batch_rollouts, device))


def agreement(mine: torch.Tensor) -> Agreement:
    """One collective per iteration: every rank's `proposal` all-gathered and reduced alike
    (`agreement_of`); none in a world of one."""
    return agreement_of(mine[None] if dist.get_world_size() == 1 else every_rank(mine))


def proposal(
    ready: bool,
    overdue: bool,
    stop: bool,
    member_samples: list[int],
    decision_bytes: int,
    checkpoint: bool,
    batch_rollouts: int,
    device: torch.device,
) -> torch.Tensor:
    """This rank's side of an agreement, as a row of int64. Only rank 0 offers a decision, so the
    sum is its length. `member_samples`: what this rank would train on if the world updates now;
    `batch_rollouts`: the most rollouts of one member it would take, whose largest over the ranks
    shapes every rank's batch (learner batching: the minibatches, and so the backward passes, must
    match)."""
    return torch.tensor(
        [int(ready), int(overdue), int(stop), decision_bytes, int(checkpoint), batch_rollouts, *member_samples],
        dtype=torch.int64,
        device=device,
    )


def agreement_of(rows: torch.Tensor) -> Agreement:
    """The agreement of every rank's `proposal` rows [world, n]: the same on every rank."""
    ready_ranks, overdue_ranks, stops, length, checkpoints, _, *samples = rows.sum(0).tolist()
    return Agreement(
        ready_ranks == len(rows) or overdue_ranks > 0,
        stops > 0,
        samples,
        length,
        checkpoints > 0,
        int(rows[:, 5].max()),
    )


def extremes(value: int, device: torch.device) -> tuple[int, int]:
    """(smallest, largest) of every rank's `value`."""
    if dist.get_world_size() == 1:
        return value, value
    values = every_rank(torch.tensor([value], dtype=torch.int64, device=device))
    return int(values.min()), int(values.max())


def every_rank(values: torch.Tensor) -> torch.Tensor:
    """Every rank's `values`, stacked in rank order [world, ...], for a small tensor to be reduced
    locally: an all-gather is one step of gloo's ring where its all-reduce takes two, so half the
    round trips between ranks on different hosts (docs/architecture.md, "Learners across a network")."""
    everyone = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, values)
    return torch.stack(everyone)


def share_any_length(data: bytes, device: torch.device) -> bytes:
    """Rank 0's `data` on every rank, its length unknown to the others."""
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    return share(data, int(length.item()), device)


def share(data: bytes, length: int, device: torch.device) -> bytes:
    """Rank 0's `data` (`length` bytes) on every rank: a broadcast of raw bytes, never pickle
    (torch's broadcast_object_list would unpickle whatever arrives)."""
    buffer = torch.zeros(length, dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().numpy())


def shutdown(together: bool = False) -> None:
    """Leave the world. `together` (a clean stop, which every rank reaches at the same iteration):
    wait for the others first; a rank that tore its world down while a peer still used it made
    that peer abort at exit now and then ("terminate called without an active exception")."""
    if dist.is_initialized():
        if together and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
