"""How an update's batch is cut into minibatches: its samples at random, or, for a recurrent
network, whole sequences of a slot's steps (a rollout's, or chunks of `ppo.bptt_steps`, each
from the state the core reached there), unrolled from their `Memory`. Learner batching's larger
batches grow the minibatches' number or size (`for_batch`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from rlmq.common.algorithms import PPOConfig
from rlmq.learners.networks import Memory, PopulationActorCritic


def pick(x: Tensor, idx: Tensor | None, slots: int = 0) -> Tensor:
    """A minibatch's samples of a [P, n, ...] tensor (None: all of them). With `slots`, `idx` names
    whole env slots of the n = T · slots time-major samples: each slot's T steps, in order."""
    if idx is None:
        return x
    if not slots:
        return x[:, idx]
    return x.reshape(x.shape[0], -1, slots, *x.shape[2:])[:, :, idx].flatten(1, 2)


def minibatch_memory(memory: Memory | None, idx: Tensor | None) -> Memory | None:
    """A minibatch's part of `memory` (whole sequences: `in_sequences`)."""
    if memory is None or idx is None:
        return memory
    return Memory(memory.state[:, idx], memory.starts[:, :, idx])


def in_sequences(
    core: PopulationActorCritic, memory: Memory, obs: Tensor, length: int, per_sample: Sequence[Tensor]
) -> tuple[Memory, list[Tensor]]:
    """What a recurrent network trains on: its `per_sample` tensors [P, T · B, ...] (time-major,
    `obs` among them) cut into sequences of `length` steps of a slot, [P, length · (C · B), ...]
    time-major over C · B sequences (chunk c of slot b is sequence c · B + b, C = T / length), and
    each sequence's `Memory`: the slot's state where the chunk starts, as the core reaches it with
    the update's starting weights, and where episodes start in it. `memory`: the batch's, over
    its T + 1 rows."""
    memory = memory._replace(starts=memory.starts[:, :-1])  # the T rows that have actions
    population, steps, slots = memory.starts.shape
    if length in (0, steps):
        return memory, list(per_sample)
    chunks = steps // length

    def cut(x: Tensor) -> Tensor:  # [P, C · L · B, ...] → [P, L · C · B, ...]
        rest = x.shape[2:]
        return x.reshape(population, chunks, length, slots, *rest).transpose(1, 2).reshape(population, -1, *rest)

    states = core.states_every(obs, memory, length).flatten(1, 2)  # [P, C · B, S]
    starts = cut(memory.starts.reshape(population, -1)).view(population, length, chunks * slots)
    return Memory(states, starts), [cut(x) for x in per_sample]


def plan_size(cfg: PPOConfig, valid: Tensor, recurrent: bool) -> int:
    """What `minibatch_plan` splits: the samples of a batch whose validity is `valid` [P, T, B],
    or a recurrent network's sequences."""
    steps, slots = valid.shape[1:]
    return steps // (cfg.bptt_steps or steps) * slots if recurrent else steps * slots


def for_batch(cfg: PPOConfig, rollouts: int) -> PPOConfig:
    """The update's config for a batch of `rollouts` per member (learner batching, at most
    `cfg.max_rollouts_per_batch`), k = rollouts / `rollouts_per_batch` times the usual batch:
    "count", k times the minibatches, each of the usual size (the same gradient steps per sample);
    "size", `cfg.minibatches` of them, k times as large (the same gradient steps per update);
    "sqrt", √k times the minibatches (rounded to the nearest), each √k times as large: between
    the two. Never fewer than `cfg.minibatches`."""
    if cfg.minibatch_growth == "size":
        return cfg
    if cfg.minibatch_growth == "sqrt":
        growth = math.sqrt(rollouts / cfg.rollouts_per_batch)
        return dataclasses.replace(cfg, minibatches=max(round(cfg.minibatches * growth), cfg.minibatches))
    return dataclasses.replace(
        cfg, minibatches=max(cfg.minibatches * rollouts // cfg.rollouts_per_batch, cfg.minibatches)
    )


def minibatch_plan(samples: int, cfg: PPOConfig, generator: torch.Generator) -> list[Tensor | None]:
    """Sample indices (a recurrent network's: slot indices, `samples` the slots) of each minibatch
    of each epoch (None: all of them, in order). The same
    number of minibatches on every rank, whatever its sample count: DDP needs every rank to run
    the same number of backward passes."""
    if cfg.minibatches == 1:
        return [None] * cfg.epochs
    return [
        idx
        for _ in range(cfg.epochs)
        for idx in torch.tensor_split(torch.randperm(samples, generator=generator), cfg.minibatches)
    ]
