"""Replicated updates: every learner rank trains on every rank's batch, so that an update costs the
world one collective instead of one per gradient step.

DDP all-reduces the gradient after every minibatch's backward pass: PPO's update of 10 epochs of
one minibatch makes 10 all-reduces, each two round trips between the ranks. Between ranks on
one host or one rack that is cheap; between hosts a few milliseconds apart it is most of the update.
With `ppo.sync = "batch"` the ranks instead all-gather their batches once (`gather_along`), and each
rank runs the same update on the same data in the same minibatch order: the same arithmetic in the
same order gives every rank the same weights, as DDP's averaged gradients do. The gradient of each
minibatch is the mean loss over every rank's samples in it, as DDP's (its advantages normalized
over the whole minibatch, where DDP's ranks normalize their own shares); what replication gives up
is the division of the compute: each rank computes the whole update, so it pays where the round
trips cost more than the arithmetic, small models across a network.

Bitwise equal arithmetic needs the same kernels on every rank (the same torch build and CPU or GPU
kind; nothing here makes cuDNN deterministic). Each rank's fingerprint of its state and minibatch
generator rides in the gather; where they differ, every rank takes rank 0's (`resync`) before the
update, and says so in its log.
"""

from __future__ import annotations

import logging
import math
import time
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec, allocate, rollout_layout
from rlmq.learners.distributed import every_rank
from rlmq.learners.networks import PopulationActorCritic, obs_features

log = logging.getLogger(__name__)
GATHER_SAMPLE_BYTES = 8 << 20  # `measure` times a larger gather at this size and scales it


class SyncCosts(NamedTuple):
    """One update's synchronization each way, in seconds, as `measure` timed it."""

    ddp_step_s: float  # a gradient step on a rank's share of a minibatch, then its gradient's all-reduce
    replica_step_s: float  # a gradient step on the whole minibatch (every rank's share)
    gather_s: float  # one all-gather of a rank's batch (replicas', per update)


def choose(mode: str, world_size: int, gradient_steps: int, costs: Callable[[], SyncCosts]) -> str:
    """ "gradients" or "batch" for a world of `world_size` ranks. "auto" replicates when the
    gather and G gradient steps on whole minibatches take less than G steps on a rank's share
    with their all-reduces: gather + G·replica_step < G·ddp_step."""
    if world_size == 1:
        return "gradients"  # nothing to synchronize: no DDP wrapper, no gather
    if mode != "auto":
        return mode
    c = costs()
    replicas_s, ddp_s = c.gather_s + gradient_steps * c.replica_step_s, gradient_steps * c.ddp_step_s
    chosen = "batch" if replicas_s < ddp_s else "gradients"
    log.info(
        'ppo.sync "auto": "%s" (measured per update of %d gradient steps: replicas %.1f ms, a %.1f ms gather '
        "and steps of %.2f ms on whole minibatches; DDP %.1f ms, steps of %.2f ms on a rank's share with their "
        "all-reduces)",
        chosen,
        gradient_steps,
        replicas_s * 1e3,
        c.gather_s * 1e3,
        c.replica_step_s * 1e3,
        ddp_s * 1e3,
        c.ddp_step_s * 1e3,
    )
    return chosen


def measure(core: PopulationActorCritic, spec: EnvSpec, run_config: RunConfig, device: torch.device) -> SyncCosts:
    """`SyncCosts` on this world, the slowest rank's of each (every rank then decides alike), the
    best of a few tries: the steps (the loss's forward and backward, as `_targets` runs them) on
    zero observations of a minibatch's size, the collectives on zeros of the real sizes (a gather
    past `GATHER_SAMPLE_BYTES` timed at that size and scaled, as bandwidth then bounds it). Timed,
    not modelled: a small network's step on twice the samples costs far less than twice as much."""
    cfg, world = run_config.ppo, dist.get_world_size()
    arrays = {
        name: torch.from_numpy(a).to(device)
        for name, a in allocate(
            spec,
            run_config.rollout_length,
            run_config.num_envs * cfg.rollouts_per_batch * world,
            lead=(run_config.population,),
            zeros=True,
        ).items()
    }
    share = max(arrays["rewards"][0].numel() // (world * cfg.minibatches), 1)
    obs = obs_features(arrays["obs"][:, :-1].flatten(1, 2)[:, : world * share], spec)
    actions = arrays["actions"].flatten(1, 2)

    def step(samples: int, all_reduce: bool) -> Callable[[], None]:
        def run() -> None:
            logp, values = core.logp_and_values(obs[:, :samples], actions[:, :samples])
            (logp.sum() + values.sum()).backward()
            if all_reduce:
                dist.all_reduce(core.flat.grad)
            core.flat.grad = None

        return run

    total = gathered_bytes(spec, run_config)
    batch = torch.zeros(min(total, GATHER_SAMPLE_BYTES), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(batch) for _ in range(world)]
    costs = [
        best_of(step(share, True), device),
        best_of(step(world * share, False), device),
        best_of(lambda: dist.all_gather(gathered, batch), device) * total / len(batch),
    ]
    return SyncCosts(*every_rank(torch.tensor(costs, dtype=torch.float64, device=device)).max(0).values.tolist())


def best_of(run: Callable[[], object], device: torch.device, tries: int = 3) -> float:
    """The shortest of `tries` timed runs of `run`, after one untimed."""
    times = []
    for i in range(tries + 1):
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - started)
    return min(times)


def gathered_bytes(spec: EnvSpec, run_config: RunConfig) -> int:
    """A rank's part of the replicas' gather at its widest (learner batching's most rollouts), as
    the update holds it: every member's joined batch with its observations as float32 features
    (`obs_features`: 4 bytes a pixel, a one-hot row a Discrete observation), and the reward scale's
    running returns (float64) where rewards are normalized."""
    cfg = run_config.ppo
    steps, slots = (
        run_config.rollout_length,
        run_config.num_envs * max(cfg.rollouts_per_batch, cfg.max_rollouts_per_batch),
    )
    layout = rollout_layout(spec, steps, slots)
    per_member = sum(
        math.prod(shape) * np.dtype(dtype).itemsize for name, (shape, dtype) in layout.items() if name != "obs"
    )
    per_member += (steps + 1) * slots * spec.obs_size * 4 + (steps * slots * 8 if cfg.normalize_reward else 0)
    return per_member * run_config.population


def _bytes(t: Tensor) -> Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8)


def fingerprint(tensors: Sequence[Tensor]) -> int:
    """CRC-32 of the tensors' bytes: equal on ranks whose replicas are equal."""
    crc = 0
    for t in tensors:
        crc = zlib.crc32(_bytes(t).cpu().numpy().tobytes(), crc)
    return crc


def gather_along(tensors: Sequence[Tensor], dim: int, tags: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every rank's `tensors`, each joined along `dim` in rank order, and every rank's `tags` (an
    int64 row) as rows [world, n]: one all-gather of their bytes. Each rank's tensors must have
    the shapes and dtypes of every other's (the learners agree on the batch's width)."""
    world = dist.get_world_size()
    mine = torch.cat([*(_bytes(t) for t in tensors), _bytes(tags)])
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    sizes = [t.numel() * t.element_size() for t in (*tensors, tags)]
    pieces = [buffer.split(sizes) for buffer in everyone]
    joined = [
        torch.cat([rank[i].clone().view(t.dtype).view(t.shape) for rank in pieces], dim=dim)
        for i, t in enumerate(tensors)
    ]
    return joined, torch.stack([rank[-1].clone().view(torch.int64) for rank in pieces])


def gather_checked(
    fields: Sequence[Tensor], state: Sequence[Tensor], generator: torch.Generator, proposal: Tensor | None
) -> tuple[list[Tensor], Tensor | None, bool]:
    """`gather_along` the slot axis (2) of a PPO batch's `fields`, with the fingerprint of the
    replicas' `state` and minibatch `generator` and this rank's agreement `proposal` riding along:
    (the joined fields, every rank's proposal rows or None, whether the replicas differed). Where
    the fingerprints differ, every rank takes rank 0's `state` and `generator` (`resync`) and says so."""
    device = fields[0].device
    mine = fingerprint([*state, generator.get_state()])
    tags = torch.cat(
        [
            torch.tensor([mine], dtype=torch.int64, device=device),
            torch.zeros(0, dtype=torch.int64, device=device) if proposal is None else proposal,
        ]
    )
    joined, rows = gather_along(fields, 2, tags)
    fingerprints = rows[:, 0].tolist()
    differ = len(set(fingerprints)) > 1
    if differ:
        log.warning(
            "learner replicas differ (fingerprints %s): every rank takes rank 0's weights. Ranks with "
            'ppo.sync = "batch" need the same torch build and device kind',
            fingerprints,
        )
        resync(state, generator)
    return joined, None if proposal is None else rows[:, 1:], differ


def resync(tensors: Sequence[Tensor], generator: torch.Generator) -> None:
    """Every rank takes rank 0's `tensors` (in place) and the state of its minibatch `generator`."""
    for t in tensors:
        dist.broadcast(t.data, src=0)
    state = generator.get_state().to(tensors[0].device)  # NCCL moves device tensors only
    dist.broadcast(state, src=0)
    generator.set_state(state.cpu())
