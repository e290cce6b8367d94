"""What the off-policy algorithms (SAC, TD3, DQN) share: ReLU MLPs, SAC's and TD3's twin
critics and tunables, and the trainer that feeds any of them from this rank's replay shard.

Under several learner ranks there is no DDP wrapper: after each backward the gradient of the one
network that loss trains is averaged across ranks (`allreduce_mean`, the algorithms' `sync`) before
its own optimizer steps (the lesson of Horovod's distributed SAC: every optimizer synced).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlmq.common import wire
from rlmq.common.algorithms import ReplayConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import distributed
from rlmq.learners.networks import Stacked
from rlmq.learners.normalization import ObsNormalizer, stacked_observations
from rlmq.learners.optim import PopulationAdam, Sync
from rlmq.learners.replay import Replay
from rlmq.learners.sequence_replay import SequenceReplay
from rlmq.learners.shapes import set_member_shapes

Params = dict[str, np.ndarray]


def relu_mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Critic(nn.Module):
    """Twin Q networks of (observation, action in [-1, 1]): SAC's and TD3's."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.q1 = relu_mlp([spec.obs_size + spec.action_dim, *hidden, 1])
        self.q2 = relu_mlp([spec.obs_size + spec.action_dim, *hidden, 1])


def q_pair(
    critic: Stacked, q_layers: dict[str, list[tuple[str, str]]], obs: Tensor, action: Tensor
) -> tuple[Tensor, Tensor]:
    """Both twin critics' values of (obs, action), each [P, B]. A critic of one member given P
    members' rows is shared by them: it takes their rows as one batch."""
    x = torch.cat([obs, action], dim=-1)
    members = len(x)
    if critic.population == 1 and members > 1:
        x = x.reshape(1, -1, x.shape[-1])
    q1, q2 = (critic.mlp(q_layers[q], x).reshape(members, -1) for q in ("q1", "q2"))
    return q1, q2


def pooled(loss: Tensor, weight: Tensor) -> Tensor:
    """A critic shared by the members: their losses' mean over the members with data here, [1]."""
    return (loss.sum() / weight.sum().clamp(min=1)).reshape(1)


def shared_rates(lr: Tensor, active: Tensor, tau: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A shared critic's learning rate, whether it trains, and its τ (each [1]): the members' mean
    rate and τ, while any member trains."""
    trains = active.any().reshape(1)
    return lr.mean().reshape(1), trains, tau.mean().reshape(1) * trains


class ActorCriticHyperparams(NamedTuple):
    """Per-member tunables of SAC and TD3 (algorithms.ALGORITHMS), each [P]."""

    learning_rate: Tensor  # [P]
    gamma: Tensor
    tau: Tensor


def allreduce_mean(grad: torch.Tensor) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(grad)
        grad /= dist.get_world_size()


class OffPolicy(Protocol):
    """An off-policy algorithm over the stacked population (learners/sac.py is one)."""

    optimizers: dict[str, PopulationAdam]

    @property
    def policy_network(self) -> Stacked:
        """The members' network that the actors run (what `member_params` publishes)."""
        ...

    def member_params(self, member: int) -> Params:
        """What the actors run (the policy network), under the names common/models.py reads."""
        ...

    def load_member(self, member: int, params: Params) -> None: ...

    def replicated(self) -> list[torch.Tensor]:
        """Every tensor that must start equal on all ranks (rank 0's are broadcast)."""
        ...

    @property
    def n_step(self) -> int:
        """Env steps each stored transition spans (n-step returns; 1: one step)."""
        ...

    def hyperparams(self, members: list[dict[str, float]], device: torch.device) -> Any: ...

    def step(
        self,
        batch: Any,  # what its replay draws: Transitions, or R2D2's Sequences
        hp: Any,
        active: torch.Tensor,
        has_data: torch.Tensor,
        sync: Sync,
        generator: torch.Generator | None,
    ) -> dict[str, torch.Tensor]:
        """One gradient step of every member; per-member stats [P]."""
        ...

    def copy_member(self, source: int, target: int) -> None: ...

    def capture(self, mode: str, backend: str = "") -> None:
        """Take each gradient step's losses and optimizer steps under torch.compile in `mode`
        (learners/capture.py); eager until called."""
        ...


@runtime_checkable
class SharesCritic(Protocol):
    """An algorithm whose actors may share a critic (SAC, TD3): CEM-RL draws them, DvD sets λ."""

    diversity_weight: torch.Tensor  # DvD's λ, [] (a tensor: a captured step reads it as it is now)

    def start_generation(self, actors: list[Params], trained: list[bool]) -> None: ...


class OffPolicyTrainer:
    """An off-policy algorithm fed from this rank's replay shard: `replay_ratio` gradient steps per
    env step (of each started member, over all ranks), once a member has `learning_starts`."""

    STATE = ("algorithm", "obs_norm", "replay", "stored", "due", "rng", "generator")  # learners/checkpoint.py

    def __init__(
        self,
        algorithm: OffPolicy,
        spec: EnvSpec,
        run_config: RunConfig,
        weights: tuple[wire.Weights, ...],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.algorithm, self.device, self.population = algorithm, device, run_config.population
        population = self.population
        if run_config.compile_update != "off":
            algorithm.capture(run_config.compile_update)
        assert isinstance(run_config.algo_config, ReplayConfig)
        self.cfg, self.spec = run_config.algo_config, spec
        self.obs_norm = ObsNormalizer(population, spec.obs_size, run_config.obs_clip, device, run_config.normalize_obs)
        for network in self.member_networks():  # members of mutated widths publish them trimmed
            network.allocated_wider = run_config.mutates_layers
        for w in weights:  # a restarted world resumes the policies; the rest starts afresh
            self.load_member(w.member, dict(w.params))
        if world_size > 1:  # replicas start equal
            for tensor in algorithm.replicated():
                dist.broadcast(tensor.data, src=0)
            self.obs_norm.broadcast()
        # A recurrent core's replay keeps whole slot sequences with their first state (R2D2).
        self.replay: Replay | SequenceReplay = (
            Replay(population, self.cfg.buffer_size, spec, algorithm.n_step, self.cfg.share_replay)
            if run_config.core == "identity"
            else SequenceReplay(
                population,
                max(self.cfg.buffer_size // run_config.rollout_length, run_config.num_envs),
                spec,
                run_config.rollout_length,
                run_config.core_state_size,
                algorithm.n_step,
            )
        )
        self.stored = [0] * population  # env steps of each member over all ranks: same on every rank
        self.due = 0.0
        self.rng = np.random.default_rng([run_config.seed, rank])
        self.generator = torch.Generator(device).manual_seed(run_config.seed * 1000 + rank)

    def member_params(self, member: int) -> Params:
        return {**self.algorithm.member_params(member), **self.obs_norm.member_params(member)}

    def trained_steps(self, member: int) -> int:
        return self.stored[member]

    def load_member(self, member: int, params: Params) -> None:
        self.algorithm.load_member(member, self.obs_norm.load_member(member, params))

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None:
        self.hp = self.algorithm.hyperparams(hyperparams, self.device)
        set_member_shapes(self.member_networks(), self.algorithm.optimizers.values(), hyperparams)

    def member_networks(self) -> list[Stacked]:
        """Every network of the members' own, target networks included (a shared critic is not)."""
        return [
            network
            for network in vars(self.algorithm).values()
            if isinstance(network, Stacked) and network.population == self.population
        ]

    def grow_member(self, member: int, before: tuple[int, ...], after: tuple[int, ...], seed: int) -> None:
        """PBT's node mutation gave `member` more units (learners/shapes.py, `grow`): each network
        and its target draw the same, as they share their layout and the seed."""
        for network in self.member_networks():
            network.grow(member, before, after, seed)

    def copy_member(self, decision: wire.Decision) -> None:
        """PBT exploit: every network and optimizer state, then the decision's parameter noise on
        the policy the target's actors will run (its target networks stay the source's)."""
        self.algorithm.copy_member(decision.source, decision.target)
        self.algorithm.policy_network.add_noise(decision.target, decision.param_noise, decision.id)
        self.obs_norm.copy_member(decision.source, decision.target)
        self.stored[decision.target] = max(self.stored[decision.target], self.stored[decision.source])

    def start_generation(self, generation: wire.Generation) -> None:
        """CEM-RL: every member's actor is the one drawn for it (observation statistics are off)."""
        self.shares_critic().start_generation([dict(a) for a in generation.actors], list(generation.trained))

    def set_diversity_weight(self, weight: float) -> None:
        """DvD's adaptive λ, for every member."""
        self.shares_critic().diversity_weight.fill_(weight)

    def shares_critic(self) -> SharesCritic:
        if not isinstance(self.algorithm, SharesCritic):  # RunConfig refuses such a run: a bug
            raise RuntimeError(f"{type(self.algorithm).__name__} has no actors around a shared critic")
        return self.algorithm

    def owes_steps(self) -> bool:
        """Gradient steps due but not taken (a `max_steps_per_update` chunk was full): the next
        iteration takes them before new data. The same on every rank (`due` follows all-reduced counts)."""
        return self.due >= 1

    def nonfinite_skipped(self) -> int:
        return sum(int(optimizer.nonfinite) for optimizer in self.algorithm.optimizers.values())

    def agree(self, proposal: torch.Tensor, batch: Callable[[], list[list[wire.Rollout]]]) -> distributed.Agreement:
        return distributed.agreement(proposal)

    def train(
        self, rollouts: list[list[wire.Rollout]], member_samples: list[int], batch_rollouts: int
    ) -> tuple[dict[str, float], list[int]]:
        for member, member_rollouts in enumerate(rollouts):
            for rollout in member_rollouts:
                self.replay.add_rollout(member, rollout, gamma=float(self.hp.gamma[member]))
        # The replay keeps raw observations: batches are normalized as drawn.
        if self.obs_norm.enabled and any(member_samples):
            self.obs_norm.update(*stacked_observations(rollouts, self.spec, self.device))
        for member, count in enumerate(member_samples):
            self.stored[member] += count
        # A member's statistics moved with its data: its weights change even before it trains.
        normalized = [m for m, count in enumerate(member_samples) if count] if self.obs_norm.enabled else []
        started = [s >= max(self.cfg.learning_starts, 1) for s in self.stored]
        if not any(started):
            return {}, normalized
        active = torch.tensor(started, device=self.device)
        # Decided from all-reduced counts only, so every rank runs the same number of steps.
        new = sum(c for c, s in zip(member_samples, started, strict=True) if s) / sum(started)
        self.due += self.cfg.replay_ratio * new
        cap = self.cfg.max_steps_per_update or int(self.due)
        steps = min(int(self.due), cap)
        self.due -= steps
        totals: dict[str, torch.Tensor] = {}
        for _ in range(steps):
            batch, has_data = self.replay.sample(self.cfg.batch_size, self.rng, self.device)
            batch = batch.normalized(self.obs_norm)
            stats = self.algorithm.step(batch, self.hp, active, has_data, allreduce_mean, self.generator)
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value
        weight = active.float() / active.sum()
        summary = {name: float((value / max(steps, 1) * weight).sum()) for name, value in totals.items()}
        trained = [m for m, s in enumerate(started) if s] if steps else []
        return summary, sorted(set(trained) | set(normalized))
