"""Replay memory for the off-policy algorithms (SAC, TD3, DQN): one shard per learner rank.

Each learner rank keeps only the transitions its own actors sent it and samples its minibatches
from them; DDP then averages the gradients across ranks, so the ranks together train on the union
of their shards without ever moving experience between them. Within a rank, every population member
has its own ring buffer, stacked along a leading member axis ``[P, capacity, ...]`` so that one
vectorized draw yields a member-major batch ``[P, B, ...]`` for the population's batched update;
a shared replay (``ReplayConfig.share_replay``) draws each member's batch from all the rings together.

The memory is bounded and preallocated: the arrays are allocated once at full capacity, so a run
that fits at start fits forever, and when a member's shard is full its oldest transitions are
overwritten. Storage is NumPy (rollouts arrive as NumPy from the wire), observations in their own
dtype (common/schema.py: a uint8 image stays bytes), each observation once and each frame of a
frame stack once (learners/frames.py); a transition keeps the keys of its two observations there.
Batches leave as torch, observations as the networks' float features.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from rlmq.common.schema import EnvSpec, rollout_layout
from rlmq.common.wire import Rollout
from rlmq.learners.frames import FrameRing
from rlmq.learners.networks import obs_features

# Frame rows a shard holds per transition of capacity when observations stack frames. A rollout of
# T steps per env slot brings T + 1 observations, and a stack of k frames k − 1 more rows at each
# slot's start and each episode's: 1/8 more covers T ≥ 32 with k = 4 (a Pong episode runs ~800
# steps). Where a run needs more, its oldest transitions make room before the ring of transitions
# is full. Other observations get two rows per transition, as many as a transition ever needs.
ROWS_PER_STACKED_TRANSITION = 1.125


class Transitions(NamedTuple):
    """A sampled batch, member-major."""

    obs: Tensor  # [P, B, obs_size] float32 features (networks.obs_features)
    actions: Tensor  # [P, B] int64 (discrete) or [P, B, action_dim] float32
    rewards: Tensor  # [P, B] float32
    next_obs: Tensor  # [P, B, obs_size] float32
    terminated: Tensor  # [P, B] float32: 1.0 where the episode ended for real (no bootstrap)
    horizon: Tensor  # [P, B] float32: env steps from obs to next_obs (1; up to n with n-step returns)

    def normalized(self, norm: Callable[[Tensor], Tensor]) -> Transitions:
        """The batch with both observations through `norm` (the members' statistics)."""
        return self._replace(obs=norm(self.obs), next_obs=norm(self.next_obs))


def n_step(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step returns of every step of a [T, N] rollout (Sutton & Barto §7.1; Ape-X, Rainbow):
    G[t] = Σ_{j<k} γ^j r[t + j] over k ≤ n steps, stopping after the step that ends the episode
    (terminated or truncated) and at the rollout's end. Returns (G, k, terminated within the k
    steps); the transition's next observation is obs[t + k]."""
    steps = rewards.shape[0]
    returns = rewards.astype(np.float32)  # a copy
    horizon = np.ones(rewards.shape, np.int64)
    ended_at = terminated.copy()
    alive = ~(terminated | truncated)  # alive[t]: every step from t to the last added continued
    for j in range(1, min(n, steps)):
        more = alive[: steps - j]  # t whose steps t … t + j − 1 all continued
        returns[: steps - j] += np.where(more, gamma**j * rewards[j:], 0)
        horizon[: steps - j] += more
        ended_at[: steps - j] = np.where(more, terminated[j:], ended_at[: steps - j])
        alive[: steps - j] &= ~(terminated[j:] | truncated[j:])  # (later slices stop short of the tail)
    return returns, horizon, ended_at


class Replay:
    """One ring buffer of transitions per population member, vectorized over members."""

    # What a checkpoint saves (learners/checkpoint.py): the whole ring, written rows or not.
    STATE = ("frames", "_obs_key", "_next_key", "_actions", "_rewards", "_terminated", "_horizon", "_position", "_size")

    def __init__(self, population: int, capacity: int, spec: EnvSpec, n_step: int = 1, shared: bool = False) -> None:
        if population < 1:
            raise ValueError(f"Replay population must be at least 1, got {population}")
        if capacity < 1:
            raise ValueError(f"Replay capacity must be at least 1, got {capacity}")
        if n_step < 1:
            raise ValueError(f"Replay n_step must be at least 1, got {n_step}")
        self.population, self.capacity, self.spec, self.n_step = population, capacity, spec, n_step
        self.shared = shared  # every member samples from every member's transitions (ReplayConfig.share_replay)
        # One step of the rollout layout: what a transition's observation and action look like.
        self.layout = {
            name: (shape[2:], np.dtype(dtype)) for name, (shape, dtype) in rollout_layout(spec, 1, 1).items()
        }
        shape = (population, capacity)
        # np.zeros maps untouched pages lazily, yet the whole bound is reserved up front; rows
        # never written stay zero, which is what `sample` hands out for an empty member.
        stacked = spec.frame_stack > 1
        rows = int(capacity * ROWS_PER_STACKED_TRANSITION) + spec.frame_stack if stacked else 2 * capacity
        self.frames = FrameRing(population, rows, spec)
        self._obs_key = np.zeros(shape, np.int64)  # keys into `frames`
        self._next_key = np.zeros(shape, np.int64)
        self._actions = np.zeros((*shape, *self.layout["actions"][0]), self.layout["actions"][1])
        self._rewards = np.zeros(shape, np.float32)
        self._terminated = np.zeros(shape, np.float32)
        self._horizon = np.ones(shape, np.float32)
        self._position = np.zeros(population, np.int64)  # the next row each member writes
        self._size = np.zeros(population, np.int64)

    def _check_member(self, member: int) -> None:
        if not 0 <= member < self.population:
            raise ValueError(f"member {member} out of range for a population of {self.population}")

    def add_rollout(self, member: int, rollout: Rollout, gamma: float = 1.0) -> int:
        """Store every valid step of `rollout` as a transition of `member`; return how many.
        `gamma` discounts the n-step returns (with n_step 1 it is not used)."""
        self._check_member(member)
        for name in ("obs", "actions"):
            array, (shape, dtype) = getattr(rollout, name), self.layout[name]
            if (array.shape[2:], array.dtype) != (shape, dtype):
                raise ValueError(
                    f"rollout {name} are {array.dtype}{list(array.shape[2:])}, replay holds {dtype}{list(shape)}"
                )
        # Next-step autoreset: obs[t + 1] is the final observation of an episode ending at t, and the
        # reset step after it is invalid, so obs[t + 1] is the right next_obs for every valid t.
        # Truncated steps keep terminated = 0 so that they bootstrap from that final observation.
        # An n-step transition never crosses an episode's end, so it never reaches an invalid step.
        returns, horizon, terminated = n_step(
            rollout.rewards, rollout.terminated, rollout.truncated, gamma, self.n_step
        )
        keys = self.frames.add(member, rollout.obs)  # [N, T + 1]
        # Everything below walks [N, T] slot by slot, oldest step first, as the frames were written:
        # the transitions' keys then grow in the order they are stored.
        valid = rollout.valid.T
        slots, steps = np.arange(valid.shape[0])[:, None], np.arange(valid.shape[1])[None, :]
        obs_key, next_key = keys[:, :-1][valid], keys[slots, steps + horizon.T][valid]
        actions = np.swapaxes(rollout.actions, 0, 1)[valid]
        rewards, terminated, horizon = returns.T[valid], terminated.T[valid], horizon.T[valid]
        added = len(obs_key)
        if added > self.capacity:  # only the newest `capacity` would survive the wrap anyway
            keep = slice(added - self.capacity, None)
            obs_key, next_key, actions = obs_key[keep], next_key[keep], actions[keep]
            rewards, terminated, horizon = rewards[keep], terminated[keep], horizon[keep]
        count = len(obs_key)
        # Distinct rows, since count ≤ capacity: no write in this call lands on another.
        rows = (self._position[member] + np.arange(count)) % self.capacity
        self._obs_key[member, rows] = obs_key
        self._next_key[member, rows] = next_key
        self._actions[member, rows] = actions
        self._rewards[member, rows] = rewards
        self._terminated[member, rows] = terminated
        self._horizon[member, rows] = horizon
        self._position[member] = (self._position[member] + count) % self.capacity
        self._size[member] = min(int(self._size[member]) + count, self.capacity)
        self._size[member] -= self._overwritten(member)
        return added

    def _overwritten(self, member: int) -> int:
        """How many of `member`'s oldest transitions point at observations the frame ring has
        overwritten: their keys grow in storage order, so they are a prefix, found by bisection."""
        intact_from, size = self.frames.intact_from(member), int(self._size[member])
        oldest = int(self._position[member]) - size  # storage order i is row (oldest + i) % capacity
        low, high = 0, size
        while low < high:
            middle = (low + high) // 2
            if self._obs_key[member, (oldest + middle) % self.capacity] < intact_from:
                low = middle + 1
            else:
                high = middle
        return low

    def size(self, member: int) -> int:
        self._check_member(member)
        return int(self._size[member])

    def sample(
        self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu"
    ) -> tuple[Transitions, Tensor]:
        """Draw `batch_size` transitions per member, uniformly with replacement from its own (or,
        shared, from all members' together).

        Returns the batch and a [P] bool `active` mask: False for members with nothing to draw from,
        whose rows are zeros (the caller masks their loss rather than the batch changing shape).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        owner, order, active = self._draw(batch_size, rng)
        index = (self._position - self._size)[owner] + order
        index %= self.capacity
        arrays = [
            self.frames.gather(owner, self._obs_key[owner, index]),
            self._actions[owner, index],
            self._rewards[owner, index],
            self.frames.gather(owner, self._next_key[owner, index]),
            self._terminated[owner, index],
            self._horizon[owner, index],
        ]
        for array in arrays:
            array[~active] = 0  # advanced indexing copied: the storage is untouched
        obs, actions, rewards, next_obs, terminated, horizon = (torch.from_numpy(array).to(device) for array in arrays)
        # Observations cross to the device in their own dtype (a quarter of the bytes for uint8).
        batch = Transitions(
            obs_features(obs, self.spec), actions, rewards, obs_features(next_obs, self.spec), terminated, horizon
        )
        return batch, torch.from_numpy(active).to(device)

    def _draw(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One draw for the whole population: for each of [P, B] draws, the member that stored the
        transition and its storage order i < that member's size; and the [P] `active` mask."""
        # floor(u * n) can round up to n itself for u just below 1, hence the clamps; a member with
        # nothing to draw from draws its own order 0, zeroed by the caller.
        uniform = rng.random((self.population, batch_size))
        if not self.shared:
            order = np.minimum(
                np.floor(uniform * self._size[:, None]).astype(np.int64), np.maximum(self._size - 1, 0)[:, None]
            )
            owner = np.broadcast_to(np.arange(self.population)[:, None], order.shape)
            return owner, order, self._size > 0
        # All members' transitions as one list, member by member: the i-th lies with the member
        # whose cumulative size first exceeds i (empty members are skipped by the search).
        total, ends = int(self._size.sum()), np.cumsum(self._size)
        flat = np.minimum(np.floor(uniform * total).astype(np.int64), max(total - 1, 0))
        owner = np.minimum(np.searchsorted(ends, flat, side="right"), self.population - 1)
        order = flat - (ends - self._size)[owner]
        return owner, order, np.full(self.population, total > 0)

    def copy_member(self, source: int, target: int) -> None:
        """Population-based training's exploit step: `target` takes a copy of `source`'s memory."""
        self._check_member(source)
        self._check_member(target)
        for array in (self._obs_key, self._next_key, self._actions, self._rewards, self._terminated, self._horizon):
            array[target] = array[source]
        self.frames.copy_member(source, target)
        self._position[target] = self._position[source]
        self._size[target] = self._size[source]
