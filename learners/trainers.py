"""What a learner rank trains, behind one interface: PPO on fresh rollouts, SAC from replay.

The learner service (learner.py) owns sockets, credits, the agreement and PBT bookkeeping; each
iteration it hands the trainer the rollouts every rank agreed to consume, and the trainer updates
the whole population. A trainer is created after the torch.distributed world is up.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rlmq.common import wire
from rlmq.common.config import EnvSpec, ReplayConfig, RunConfig
from rlmq.learners import ppo
from rlmq.learners.dqn import DQN
from rlmq.learners.networks import PopulationActorCritic, Stacked
from rlmq.learners.optim import PopulationAdam, Sync, per_member
from rlmq.learners.replay import Replay, Transitions
from rlmq.learners.sac import SAC
from rlmq.learners.td3 import TD3

Params = dict[str, np.ndarray]


class Trainer(Protocol):
    def member_params(self, member: int) -> Params: ...

    def trained_steps(self, member: int) -> int:
        """Env steps the member has trained on (over all ranks), published with its weights."""
        ...

    def load_member(self, member: int, params: Params) -> None: ...

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None: ...

    def copy_member(self, decision: wire.Decision) -> None: ...

    def train(self, rollouts: list[list[wire.Rollout]], member_samples: list[int]) -> tuple[dict[str, float], list[int]]:
        """One iteration on this rank's share; (stats, the members whose policy changed)."""
        ...

    def nonfinite_skipped(self) -> int:
        """Member steps skipped so far because the gradient was not finite (learners/optim.py)."""
        ...


def add_noise(stacked: Stacked, member: int, std: float, seed: int) -> None:
    """Parameter noise after a PBT copy, seeded by the decision: every rank draws the same."""
    if std > 0:
        with torch.no_grad():
            noise = torch.randn(stacked.flat.shape[1], generator=torch.Generator().manual_seed(seed))
            stacked.flat[member] += std * noise.to(stacked.flat.device)


def copy_member(core: PopulationActorCritic, optimizer: PopulationAdam, decision: wire.Decision) -> None:
    """PBT exploit for PPO: target ← source, weights and optimizer state, plus the decision's noise."""
    with torch.no_grad():
        core.flat[decision.target] = core.flat[decision.source]
    add_noise(core, decision.target, decision.param_noise, decision.id)
    optimizer.copy_member(decision.source, decision.target)


def allreduce_mean(grad: torch.Tensor) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(grad)
        grad /= dist.get_world_size()


class PPOTrainer:
    def __init__(self, spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...], rank: int,
                 world_size: int, device: torch.device) -> None:  # fmt: skip
        self.spec, self.run_cfg, self.cfg, self.device = spec, run_cfg, run_cfg.ppo, device
        self.world_size, population = world_size, run_cfg.population
        self.core = PopulationActorCritic(spec, run_cfg.hidden_sizes, population).to(device)
        for w in weights:  # a restarted world carries on from the last publication
            self.core.load_member(w.member, dict(w.params))
        self.model: torch.nn.Module = self.core
        if world_size > 1:  # DDP broadcasts rank 0's parameters: replicas start equal
            self.model = DistributedDataParallel(self.core, device_ids=[device.index] if device.type == "cuda" else None)
        self.optimizer = PopulationAdam(self.core.flat)
        self.generator = torch.Generator().manual_seed(run_cfg.seed * 1000 + rank)
        self.trained = [0] * population  # env steps each member trained on: drives its annealing
        self.horizon = max(run_cfg.total_steps // population, 1)

    def member_params(self, member: int) -> Params:
        return self.core.member_params(member)

    def trained_steps(self, member: int) -> int:
        return self.trained[member]

    def load_member(self, member: int, params: Params) -> None:
        self.core.load_member(member, params)

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None:
        self.hp = per_member(ppo.MemberHyperparams, hyperparams, self.device)

    def copy_member(self, decision: wire.Decision) -> None:
        copy_member(self.core, self.optimizer, decision)
        self.trained[decision.target] = self.trained[decision.source]

    def nonfinite_skipped(self) -> int:
        return int(self.optimizer.nonfinite)

    def train(self, rollouts: list[list[wire.Rollout]], member_samples: list[int]) -> tuple[dict[str, float], list[int]]:
        cfg, steps = self.cfg, self.run_cfg.rollout_length
        slots = cfg.rollouts_per_batch * self.run_cfg.num_envs
        samples = torch.tensor(member_samples, device=self.device)
        active = samples > 0
        anneal = torch.tensor([ppo.annealed(cfg, t, self.horizon) for t in self.trained], device=self.device)
        batch = ppo.join_rollouts(rollouts, self.spec, steps, slots, self.device)
        plan = [None if idx is None else idx.to(self.device) for idx in ppo.minibatch_plan(steps * slots, cfg, self.generator)]
        norm = ppo.loss_normalizers(samples, cfg.minibatches, self.world_size)
        stats = ppo.update(self.model, self.core, self.optimizer, batch, self.hp, cfg, plan, anneal, norm, active)
        updated = [int(m) for m in active.nonzero().flatten().tolist()]
        for member in updated:
            self.trained[member] += member_samples[member]
        return stats, updated


class OffPolicy(Protocol):
    """An off-policy algorithm over the stacked population (learners/sac.py is one)."""

    optimizers: dict[str, PopulationAdam]

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

    def step(self, batch: Transitions, hp: Any, active: torch.Tensor, has_data: torch.Tensor, sync: Sync,
             generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """One gradient step of every member; per-member stats [P]."""
        ...

    def copy_member(self, source: int, target: int) -> None: ...


class OffPolicyTrainer:
    """An off-policy algorithm fed from this rank's replay shard: `replay_ratio` gradient steps per
    env step (of each started member, over all ranks), once a member has `learning_starts`."""

    def __init__(self, algorithm: OffPolicy, spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...],
                 rank: int, world_size: int, device: torch.device) -> None:  # fmt: skip
        self.algorithm, self.device, population = algorithm, device, run_cfg.population
        assert isinstance(run_cfg.algo_config, ReplayConfig)
        self.cfg = run_cfg.algo_config
        for w in weights:  # a restarted world resumes the policies; the rest starts afresh
            algorithm.load_member(w.member, dict(w.params))
        if world_size > 1:  # replicas start equal
            for tensor in algorithm.replicated():
                dist.broadcast(tensor.data, src=0)
        action_shape = () if spec.action_kind == "discrete" else (spec.action_dim,)
        dtype = np.dtype(np.int64 if spec.action_kind == "discrete" else np.float32)
        self.replay = Replay(population, self.cfg.buffer_size, spec.obs_dim, action_shape, dtype, algorithm.n_step)
        self.stored = [0] * population  # env steps of each member over all ranks: same on every rank
        self.due = 0.0
        self.rng = np.random.default_rng([run_cfg.seed, rank])
        self.generator = torch.Generator(device).manual_seed(run_cfg.seed * 1000 + rank)

    def member_params(self, member: int) -> Params:
        return self.algorithm.member_params(member)

    def trained_steps(self, member: int) -> int:
        return self.stored[member]

    def load_member(self, member: int, params: Params) -> None:
        self.algorithm.load_member(member, params)

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None:
        self.hp = self.algorithm.hyperparams(hyperparams, self.device)

    def copy_member(self, decision: wire.Decision) -> None:
        self.algorithm.copy_member(decision.source, decision.target)
        self.stored[decision.target] = max(self.stored[decision.target], self.stored[decision.source])

    def nonfinite_skipped(self) -> int:
        return sum(int(optimizer.nonfinite) for optimizer in self.algorithm.optimizers.values())

    def train(self, rollouts: list[list[wire.Rollout]], member_samples: list[int]) -> tuple[dict[str, float], list[int]]:
        for member, member_rollouts in enumerate(rollouts):
            for rollout in member_rollouts:
                self.replay.add_rollout(member, rollout, gamma=float(self.hp.gamma[member]))
        for member, count in enumerate(member_samples):
            self.stored[member] += count
        started = [s >= max(self.cfg.learning_starts, 1) for s in self.stored]
        if not any(started):
            return {}, []
        active = torch.tensor(started, device=self.device)
        # Decided from all-reduced counts only, so every rank runs the same number of steps.
        new = sum(c for c, s in zip(member_samples, started, strict=True) if s) / sum(started)
        self.due += self.cfg.replay_ratio * new
        steps, self.due = int(self.due), self.due - int(self.due)
        totals: dict[str, torch.Tensor] = {}
        for _ in range(steps):
            batch, has_data = self.replay.sample(self.cfg.batch_size, self.rng, self.device)
            stats = self.algorithm.step(batch, self.hp, active, has_data, allreduce_mean, self.generator)
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value
        weight = active.float() / active.sum()
        summary = {name: float((value / max(steps, 1) * weight).sum()) for name, value in totals.items()}
        return summary, [m for m, s in enumerate(started) if s] if steps else []


def make_trainer(spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...], rank: int,
                 world_size: int, device: torch.device) -> Trainer:  # fmt: skip
    trainer: Trainer
    if run_cfg.algo == "sac":
        sac = SAC(spec, run_cfg.sac, run_cfg.population, device)
        trainer = OffPolicyTrainer(sac, spec, run_cfg, weights, rank, world_size, device)
    elif run_cfg.algo == "td3":
        td3 = TD3(spec, run_cfg.td3, run_cfg.population, device)
        trainer = OffPolicyTrainer(td3, spec, run_cfg, weights, rank, world_size, device)
    elif run_cfg.algo == "dqn":
        dqn = DQN(spec, run_cfg.dqn, run_cfg.population, device)
        trainer = OffPolicyTrainer(dqn, spec, run_cfg, weights, rank, world_size, device)
    else:
        trainer = PPOTrainer(spec, run_cfg, weights, rank, world_size, device)
    return trainer
