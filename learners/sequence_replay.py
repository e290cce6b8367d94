"""R2D2's replay (learners/r2d2.py): whole slot sequences with the core state they started from.

Each stored item is one env slot's rollout, its T steps and T + 1 observations (observations in
their own dtype, as learners/replay.py keeps them), its n-step returns, and the core state the
actor shipped for the slot's first step (R2D2's stored state, Kapturowski et al. 2019). A batch is
whole sequences, member-major and time-major within, ready for `cores.unroll`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners.networks import obs_features
from rlmq.learners.replay import n_step


class Sequences(NamedTuple):
    """A sampled batch of stored sequences, member-major and time-major within each member."""

    obs: Tensor  # [P, T + 1, B, obs_size] float32 features
    actions: Tensor  # [P, T, B] int64
    returns: Tensor  # [P, T, B] float32: n-step returns (replay.n_step)
    horizon: Tensor  # [P, T, B] int64: steps from a row to the row it bootstraps from
    terminated: Tensor  # [P, T, B] float32: the episode ended for real within the horizon
    valid: Tensor  # [P, T, B] bool: a step to learn from (not padding, not an autoreset step)
    core_state: Tensor  # [P, B, S]: each sequence's state at its first step

    def normalized(self, norm: Callable[[Tensor], Tensor]) -> Sequences:
        return self._replace(obs=norm(self.obs))


class SequenceReplay:
    """One ring of whole slot sequences (a rollout's T steps of one env slot, its T + 1
    observations and its first core state) per population member, vectorized over members."""

    STATE = ("_obs", "_actions", "_returns", "_horizon", "_terminated", "_valid", "_state", "_position", "_size")

    def __init__(self, population: int, capacity: int, spec: EnvSpec, steps: int, state_size: int, n: int) -> None:
        if min(population, capacity, steps, state_size, n) < 1:
            raise ValueError("a sequence replay needs a population, capacity, steps, state and n of at least 1")
        self.population, self.capacity, self.spec, self.steps, self.n_step = population, capacity, spec, steps, n
        shape = (population, capacity)
        self._obs = np.zeros((*shape, steps + 1, *spec.obs_shape), spec.obs_dtype)
        self._actions = np.zeros((*shape, steps), np.int64)
        self._returns = np.zeros((*shape, steps), np.float32)
        self._horizon = np.ones((*shape, steps), np.int64)
        self._terminated = np.zeros((*shape, steps), np.float32)
        self._valid = np.zeros((*shape, steps), bool)
        self._state = np.zeros((*shape, state_size), np.float32)
        self._position = np.zeros(population, np.int64)  # the next sequence each member writes
        self._size = np.zeros(population, np.int64)

    def add_rollout(self, member: int, rollout: Rollout, gamma: float = 1.0) -> int:
        """Store each slot of `rollout` as a sequence of `member`; return its valid steps."""
        if not 0 <= member < self.population:
            raise ValueError(f"member {member} out of range for a population of {self.population}")
        if rollout.core_state is None or rollout.rewards.shape[0] != self.steps:
            raise ValueError(f"a sequence replay stores rollouts of {self.steps} steps with their core state")
        returns, horizon, terminated = n_step(
            rollout.rewards, rollout.terminated, rollout.truncated, gamma, self.n_step
        )
        slots = rollout.rewards.shape[1]
        keep = slice(max(slots - self.capacity, 0), None)  # only the newest `capacity` would survive
        rows = (self._position[member] + np.arange(min(slots, self.capacity))) % self.capacity
        self._obs[member, rows] = np.swapaxes(rollout.obs, 0, 1)[keep]
        for store, array in (
            (self._actions, rollout.actions),
            (self._returns, returns),
            (self._horizon, horizon),
            (self._terminated, terminated),
            (self._valid, rollout.valid),
        ):
            store[member, rows] = array.T[keep]
        self._state[member, rows] = rollout.core_state[keep]
        self._position[member] = (self._position[member] + len(rows)) % self.capacity
        self._size[member] = min(int(self._size[member]) + len(rows), self.capacity)
        return int(np.count_nonzero(rollout.valid))

    def sample(
        self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu"
    ) -> tuple[Sequences, Tensor]:
        """`batch_size` sequences per member, uniformly with replacement from its own, and the [P]
        `active` mask (a member with none gets zeros, all invalid)."""
        uniform = rng.random((self.population, batch_size))
        order = np.minimum(
            np.floor(uniform * self._size[:, None]).astype(np.int64), np.maximum(self._size - 1, 0)[:, None]
        )
        index = ((self._position - self._size)[:, None] + order) % self.capacity
        owner = np.arange(self.population)[:, None]
        active = self._size > 0
        arrays = [
            array[owner, index]
            for array in (self._obs, self._actions, self._returns, self._horizon, self._terminated, self._valid)
        ]
        arrays[-1][~active] = False
        obs, actions, returns, horizon, terminated, valid = (
            torch.from_numpy(np.swapaxes(array, 1, 2)).to(device)
            for array in arrays  # time-major
        )
        batch = Sequences(
            obs_features(obs, self.spec),
            actions,
            returns,
            horizon,
            terminated,
            valid,
            torch.from_numpy(self._state[owner, index]).to(device),
        )
        return batch, torch.from_numpy(active).to(device)

    def copy_member(self, source: int, target: int) -> None:
        """Population-based training's exploit step: `target` takes a copy of `source`'s memory."""
        for name in self.STATE:
            getattr(self, name)[target] = getattr(self, name)[source]
