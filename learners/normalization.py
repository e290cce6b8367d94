"""Running normalization of observations and rewards, per population member and the same on every
learner rank (SB3's VecNormalize, moved to the learner).

Observations: each member's running mean and variance of its observation features, merged
(Chan et al.'s parallel algorithm, as SB3's RunningMeanStd) with the moments of every rank's new
data, all-reduced (or, for PPO's replicas, taken from every rank's gathered batch:
learners/replicas.py), so that every rank holds the statistics of all actors' data. They travel
inside the member's weights (`obs_norm.mean`, `obs_norm.var`): an actor normalizes a step exactly
as the learner that trained those weights did, and checkpoints, `rlmq eval` and `rlmq export` get
them for free.

Rewards (PPO): divided by the running standard deviation of each actor slot's discounted return,
reset at every episode's end, as VecNormalize does; clipped to ±clip. A learner rank carries each
slot's return from an actor's rollout into the next only when that is the next one the actor
collected (`Rollout.sequence`; the newest `MAX_ACTORS` actors): with one rank that is every
rollout, with several an actor's rollouts are spread over them and each rank restarts the returns
of the rollouts whose predecessor went elsewhere (the estimate then runs lower over long episodes).
"""

from __future__ import annotations

import collections

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from rlmq.common.schema import OBS_NORM_EPS, OBS_NORM_KEYS, EnvSpec, side_by_side
from rlmq.common.wire import Rollout
from rlmq.learners.networks import obs_features

MAX_ACTORS = 4096


class RunningMoments:
    """Per-member running mean and (population) variance of [P, n, *F] data, merged across ranks.
    Before any data: mean 0, variance 1, count 0 (normalizing is then the identity)."""

    STATE = ("mean", "var", "count")  # what a checkpoint saves (learners/checkpoint.py)

    def __init__(self, population: int, shape: tuple[int, ...], device: torch.device) -> None:
        self.mean = torch.zeros(population, *shape, dtype=torch.float64, device=device)
        self.var = torch.ones(population, *shape, dtype=torch.float64, device=device)
        self.count = torch.zeros(population, dtype=torch.float64, device=device)

    def update(self, x: Tensor, mask: Tensor, across_ranks: bool = True) -> None:
        """Merge in the rows of x [P, n, *F] where mask [P, n] is True, over all ranks (or this
        rank's alone where `across_ranks` is False: it holds every rank's data, learners/replicas.py)."""
        x64, weight = x.to(torch.float64), mask.to(torch.float64)
        weight = weight.view(*weight.shape, *([1] * (x.ndim - 2)))
        local = torch.cat(
            [
                mask.to(torch.float64).sum(1, keepdim=True),
                (x64 * weight).sum(1).reshape(len(x), -1),
                (x64 * x64 * weight).sum(1).reshape(len(x), -1),
            ],
            dim=1,
        )
        if across_ranks and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(local)
        size = self.mean[0].numel()
        count = local[:, 0]
        seen = count > 0
        batch_mean = (local[:, 1 : 1 + size] / count.clamp(min=1)[:, None]).view_as(self.mean)
        batch_var = (local[:, 1 + size :] / count.clamp(min=1)[:, None]).view_as(self.var) - batch_mean**2
        batch_var = batch_var.clamp(min=0)
        total = self.count + count
        share = (count / total.clamp(min=1e-12)).view(-1, *([1] * (self.mean.ndim - 1)))
        delta = batch_mean - self.mean
        keep = (self.count / total.clamp(min=1e-12)).view_as(share)
        merged_var = keep * self.var + share * batch_var + delta**2 * keep * share
        where = seen.view_as(share)
        self.mean = torch.where(where, self.mean + delta * share, self.mean)
        self.var = torch.where(where, merged_var, self.var)
        self.count = total

    def copy_member(self, source: int, target: int) -> None:
        for stat in (self.mean, self.var, self.count):
            stat[target] = stat[source]

    def broadcast(self) -> None:
        """Every rank takes rank 0's statistics (each rank loaded its own Assign's weights)."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            for stat in (self.mean, self.var, self.count):
                dist.broadcast(stat, src=0)


class ObsNormalizer(RunningMoments):
    """Observation features [P, ..., F] → clip((x − mean) / √(var + ε), ±clip), per member; when
    the run does not normalize (`enabled` False), the identity that publishes no statistics."""

    def __init__(self, population: int, size: int, clip: float, device: torch.device, enabled: bool = True) -> None:
        super().__init__(population, (size,), device)
        self.clip, self.enabled = clip, enabled

    def update(self, x: Tensor, mask: Tensor, across_ranks: bool = True) -> None:
        if self.enabled:
            super().update(x, mask, across_ranks)

    def __call__(self, x: Tensor) -> Tensor:
        if not self.enabled:
            return x
        # From the float32 values the weights publish, as the actors compute them (ObsNorm).
        shape = (x.shape[0], *([1] * (x.ndim - 2)), x.shape[-1])
        mean = self.mean.float().view(shape)
        std = (self.var.float().double() + OBS_NORM_EPS).sqrt().float().view(shape)
        return ((x - mean) / std).clamp(-self.clip, self.clip)

    def member_params(self, member: int) -> dict[str, np.ndarray]:
        if not self.enabled:
            return {}
        mean_key, var_key, count_key, clip_key = OBS_NORM_KEYS
        return {
            mean_key: self.mean[member].float().cpu().numpy().copy(),
            var_key: self.var[member].float().cpu().numpy().copy(),
            count_key: np.array(float(self.count[member]), np.float32),
            clip_key: np.array(self.clip, np.float32),
        }

    def load_member(self, member: int, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take the statistics published with a member's weights (a restarted world's); returns
        the network's parameters, the rest."""
        mean_key, var_key, count_key, _ = OBS_NORM_KEYS
        if self.enabled and mean_key in params:
            for stat, key in ((self.mean, mean_key), (self.var, var_key), (self.count, count_key)):
                stat[member] = torch.as_tensor(params[key], dtype=torch.float64, device=stat.device)
        return {name: value for name, value in params.items() if name not in OBS_NORM_KEYS}


def stacked_observations(per_member: list[list[Rollout]], spec: EnvSpec, device: torch.device) -> tuple[Tensor, Tensor]:
    """Every member's rollouts' observations (not the bootstrap row) as features [P, n, F] with
    their validity [P, n], members with fewer padded as invalid."""
    steps = next((len(r.valid) for rollouts in per_member for r in rollouts), 0)
    width = max((sum(r.valid.shape[1] for r in rollouts) for rollouts in per_member), default=0)
    lead = (len(per_member), steps, width)
    obs = side_by_side(per_member, np.zeros((*lead, *spec.obs_shape), spec.obs_dtype), lambda _, r: r.obs[:-1])
    valid = side_by_side(per_member, np.zeros(lead, bool), lambda _, r: r.valid)
    return (
        obs_features(torch.from_numpy(obs).flatten(1, 2), spec).to(device),
        torch.from_numpy(valid).flatten(1, 2).to(device),
    )


class RewardScaler:
    """PPO's rewards divided by the running std of the discounted return of their actor slot."""

    # What a checkpoint saves (learners/checkpoint.py). Not each actor slot's running return: a
    # restarted world starts those again, as a rank does for an actor whose rollouts went elsewhere.
    STATE = ("moments",)

    def __init__(self, population: int, clip: float, device: torch.device) -> None:
        self.moments = RunningMoments(population, (), device)
        self.clip = clip
        # actor → (the sequence number its next rollout has if it follows on, its slots' returns)
        self.returns: collections.OrderedDict[str, tuple[int, np.ndarray]] = collections.OrderedDict()

    def discounted_returns(self, rollout: Rollout, gamma: float) -> np.ndarray:
        """[T, N] running discounted return of each slot after each step, carried over from the
        actor's previous rollout when this one follows it, and reset after an episode's end."""
        steps, slots = rollout.rewards.shape
        expected, running = self.returns.pop(rollout.actor, (0, np.zeros(slots, np.float64)))
        if rollout.sequence == 0 or rollout.sequence != expected or running.shape != (slots,):
            running = np.zeros(slots, np.float64)
        out = np.empty((steps, slots), np.float64)
        done = rollout.terminated | rollout.truncated
        for t in range(steps):
            running = running * gamma + rollout.rewards[t]
            out[t] = running
            running = np.where(done[t], 0.0, running)
        self.returns[rollout.actor] = (rollout.sequence + 1, running)
        while len(self.returns) > MAX_ACTORS:
            self.returns.popitem(last=False)
        return out

    def running_returns(self, per_member: list[list[Rollout]], shape: torch.Size, gammas: list[float]) -> Tensor:
        """Each step's running discounted return, [P, T, B] as the rollouts' rewards joined along B
        in order (zeros where no rollout is)."""
        out = side_by_side(per_member, np.zeros(tuple(shape)), lambda m, r: self.discounted_returns(r, gammas[m]))
        return torch.from_numpy(out).to(self.moments.mean.device)

    def scale(self, returns: Tensor, valid: Tensor, rewards: Tensor, across_ranks: bool = True) -> Tensor:
        """Update the statistics with the valid `returns` (from `running_returns`), then scale `rewards`
        [P, T, B] by them; `across_ranks` as `RunningMoments.update` says."""
        population = rewards.shape[0]
        self.moments.update(returns.reshape(population, -1), valid.reshape(population, -1), across_ranks)
        std = (self.moments.var + OBS_NORM_EPS).sqrt().float().view(population, 1, 1)
        return (rewards / std).clamp(-self.clip, self.clip)
