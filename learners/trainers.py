"""What a learner rank trains, behind one interface: PPO on fresh rollouts, SAC, TD3 and DQN from
replay (learners/offpolicy.py); `TRAINERS` names each algorithm's.

The learner service (learner.py) owns sockets, credits, the agreement and PBT bookkeeping; each
iteration it hands the trainer the rollouts every rank agreed to consume, and the trainer updates
the whole population. A trainer is created after the torch.distributed world is up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import ppo
from rlmq.learners.dqn import DQN
from rlmq.learners.networks import PopulationActorCritic, Stacked
from rlmq.learners.normalization import ObsNormalizer, RewardScaler
from rlmq.learners.offpolicy import OffPolicy, OffPolicyTrainer, allreduce_mean
from rlmq.learners.optim import PopulationAdam, per_member
from rlmq.learners.sac import SAC
from rlmq.learners.stacked_mlp import Activation
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

    def train(self, rollouts: list[list[wire.Rollout]], member_samples: list[int],
              batch_rollouts: int) -> tuple[dict[str, float], list[int]]:
        """One iteration on this rank's share; (stats, the members whose policy changed).
        `batch_rollouts`: the most rollouts of one member any rank trains on now."""
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


class PPOTrainer:
    STATE = ("core", "optimizer", "obs_norm", "reward_scaler", "generator", "trained")  # learners/checkpoint.py

    def __init__(self, spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...], rank: int,
                 world_size: int, device: torch.device) -> None:
        self.spec, self.run_cfg, self.cfg, self.device = spec, run_cfg, run_cfg.ppo, device
        self.world_size, population = world_size, run_cfg.population
        self.core = PopulationActorCritic(spec, run_cfg.hidden_sizes, population, self.cfg.log_std_init,
                                          run_cfg.encoder_for(spec), cast(Activation, self.cfg.activation)).to(device)
        self.obs_norm = ObsNormalizer(population, spec.obs_size, run_cfg.obs_clip, device, run_cfg.normalize_obs)
        self.reward_scaler = (RewardScaler(population, self.cfg.reward_clip, device)
                              if self.cfg.normalize_reward else None)
        for w in weights:  # a restarted world carries on from the last publication
            self.load_member(w.member, dict(w.params))
        self.model: torch.nn.Module = self.core
        self.captured = None if run_cfg.compile_update == "off" else ppo.capture(run_cfg.compile_update,
                                                                                        allreduce_mean)
        if world_size > 1:  # replicas start equal: DDP broadcasts rank 0's parameters, or we do
            if self.captured is None:
                self.model = DistributedDataParallel(self.core,
                                                     device_ids=[device.index] if device.type == "cuda" else None)
            else:  # `ppo.update` all-reduces between the captured steps (`captured.sync`)
                dist.broadcast(self.core.flat.data, src=0)
            self.obs_norm.broadcast()
        self.optimizer = PopulationAdam(self.core.flat)
        self.generator = torch.Generator().manual_seed(run_cfg.seed * 1000 + rank)
        self.trained = [0] * population  # env steps each member trained on: drives its annealing
        self.horizon = max(run_cfg.total_steps // population, 1)

    def member_params(self, member: int) -> Params:
        return {**self.core.member_params(member), **self.obs_norm.member_params(member)}

    def trained_steps(self, member: int) -> int:
        return self.trained[member]

    def load_member(self, member: int, params: Params) -> None:
        self.core.load_member(member, self.obs_norm.load_member(member, params))

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None:
        self.hp = per_member(ppo.MemberHyperparams, hyperparams, self.device)

    def copy_member(self, decision: wire.Decision) -> None:
        copy_member(self.core, self.optimizer, decision)
        self.obs_norm.copy_member(decision.source, decision.target)
        if self.reward_scaler is not None:
            self.reward_scaler.moments.copy_member(decision.source, decision.target)
        self.trained[decision.target] = self.trained[decision.source]

    def nonfinite_skipped(self) -> int:
        return int(self.optimizer.nonfinite)

    def train(self, rollouts: list[list[wire.Rollout]], member_samples: list[int],
              batch_rollouts: int) -> tuple[dict[str, float], list[int]]:
        cfg, steps = ppo.for_batch(self.cfg, batch_rollouts), self.run_cfg.rollout_length
        slots = batch_rollouts * self.run_cfg.num_envs
        samples = torch.tensor(member_samples, device=self.device)
        active = samples > 0
        anneal = torch.tensor([ppo.annealed(cfg, t, self.horizon) for t in self.trained], device=self.device)
        batch = ppo.join_rollouts(rollouts, self.spec, steps, slots, self.device)
        # Statistics first, as SB3's VecNormalize updates them before it normalizes the step.
        self.obs_norm.update(batch.obs[:, :-1].flatten(1, 2), batch.valid.flatten(1))
        batch = batch._replace(obs=self.obs_norm(batch.obs))
        if self.reward_scaler is not None:
            batch = batch._replace(rewards=self.reward_scaler.scale(rollouts, batch.rewards, self.hp.gamma.tolist()))
        plan = [None if idx is None else idx.to(self.device)
                for idx in ppo.minibatch_plan(steps * slots, cfg, self.generator)]
        norm = ppo.loss_normalizers(samples, cfg.minibatches, self.world_size)
        stats = ppo.update(self.model, self.core, self.optimizer, batch, self.hp, cfg, plan, anneal, norm, active,
                           self.captured)
        updated = [int(m) for m in active.nonzero().flatten().tolist()]
        for member in updated:
            self.trained[member] += member_samples[member]
        return stats, updated


MakeTrainer = Callable[[EnvSpec, RunConfig, tuple[wire.Weights, ...], int, int, torch.device], Trainer]


def from_replay(algorithm: Callable[[EnvSpec, RunConfig, torch.device], OffPolicy]) -> MakeTrainer:
    """An off-policy algorithm's trainer: the algorithm, fed from this rank's replay shard."""

    def make(spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...], rank: int, world_size: int,
             device: torch.device) -> Trainer:
        return OffPolicyTrainer(algorithm(spec, run_cfg, device), spec, run_cfg, weights, rank, world_size, device)

    return make


# Each algorithm's trainer (algorithms.ALGORITHMS): (env spec, run config, the members' last published
# weights, rank, world size, device) → trainer.
TRAINERS: dict[str, MakeTrainer] = {
    "ppo": PPOTrainer,
    "sac": from_replay(lambda spec, run_cfg, device: SAC(spec, run_cfg.sac, run_cfg.population, device)),
    "td3": from_replay(lambda spec, run_cfg, device: TD3(spec, run_cfg.td3, run_cfg.population, device)),
    "dqn": from_replay(lambda spec, run_cfg, device: DQN(spec, run_cfg.dqn, run_cfg.population, device,
                                                         run_cfg.encoder_for(spec))),
}


def make_trainer(spec: EnvSpec, run_cfg: RunConfig, weights: tuple[wire.Weights, ...], rank: int,
                 world_size: int, device: torch.device) -> Trainer:
    return TRAINERS[run_cfg.algo](spec, run_cfg, weights, rank, world_size, device)
