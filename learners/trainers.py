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
from rlmq.learners import distributed, ppo, replicas
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

    def agree(self, proposal: torch.Tensor, batch: Callable[[], list[list[wire.Rollout]]]) -> distributed.Agreement:
        """The world's agreement on every rank's `proposal` (distributed.proposal). PPO's replicas
        gather in the same collective the `batch` this rank would take (left queued), which the
        next `train` then trains on."""
        ...

    def train(
        self, rollouts: list[list[wire.Rollout]], member_samples: list[int], batch_rollouts: int
    ) -> tuple[dict[str, float], list[int]]:
        """One iteration on this rank's `rollouts` (every rank's, for PPO's replicas, which gather
        them); (stats, the members whose policy changed). `batch_rollouts`: the most rollouts of
        one member any rank trains on now."""
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

    def __init__(
        self,
        spec: EnvSpec,
        run_cfg: RunConfig,
        weights: tuple[wire.Weights, ...],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.spec, self.run_cfg, self.cfg, self.device = spec, run_cfg, run_cfg.ppo, device
        self.world_size, population = world_size, run_cfg.population
        self.core = PopulationActorCritic(
            spec,
            run_cfg.hidden_sizes,
            population,
            self.cfg.log_std_init,
            run_cfg.encoder_for(spec),
            cast(Activation, self.cfg.activation),
        ).to(device)
        self.obs_norm = ObsNormalizer(population, spec.obs_size, run_cfg.obs_clip, device, run_cfg.normalize_obs)
        self.reward_scaler = (
            RewardScaler(population, self.cfg.reward_clip, device) if self.cfg.normalize_reward else None
        )
        for w in weights:  # a restarted world carries on from the last publication
            self.load_member(w.member, dict(w.params))
        self.model: torch.nn.Module = self.core
        self.replicated = (
            replicas.choose(
                self.cfg.sync,
                world_size,
                self.cfg.epochs * self.cfg.minibatches,
                lambda: replicas.measure(self.core, spec, run_cfg, device),
            )
            == "batch"
        )
        sync = (lambda grad: None) if self.replicated else allreduce_mean
        self.captured = None if run_cfg.compile_update == "off" else ppo.capture(run_cfg.compile_update, sync)
        if world_size > 1:  # replicas start equal: DDP broadcasts rank 0's parameters, or we do
            if self.captured is None and not self.replicated:
                self.model = DistributedDataParallel(
                    self.core, device_ids=[device.index] if device.type == "cuda" else None
                )
            else:  # `ppo.update` all-reduces between the captured steps (`captured.sync`), or no one does
                dist.broadcast(self.core.flat.data, src=0)
            self.obs_norm.broadcast()
        self.optimizer = PopulationAdam(self.core.flat)
        # Replicas draw the same minibatches; DDP's ranks each their own.
        self.generator = torch.Generator().manual_seed(run_cfg.seed * 1000 + (0 if self.replicated else rank))
        self.resyncs = 0  # times the replicas were found to differ (replicas.gather_checked)
        # Replicas agree on each iteration inside their gather (one collective, not two) where
        # every rank's batch is as wide whatever the agreement (no learner batching) and a batch
        # gathered for an iteration that does not update leaves nothing behind (no reward scale).
        self.agrees_in_gather = (
            self.replicated
            and self.reward_scaler is None
            and self.cfg.max_rollouts_per_batch <= self.cfg.rollouts_per_batch
        )
        self.staged: ppo.Batch | None = None  # every rank's batch, gathered with this iteration's agreement
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
        if self.staged is not None:  # the target's gathered data are its old policy's: not trained on
            self.staged.valid[decision.target] = False

    def nonfinite_skipped(self) -> int:
        return int(self.optimizer.nonfinite)

    def agree(self, proposal: torch.Tensor, batch: Callable[[], list[list[wire.Rollout]]]) -> distributed.Agreement:
        if not self.agrees_in_gather:
            return distributed.agreement(proposal)
        slots = self.cfg.rollouts_per_batch * self.run_cfg.num_envs
        joined = ppo.join_rollouts(batch(), self.spec, self.run_cfg.rollout_length, slots, self.device)
        self.staged, _, rows = self.gather(joined, None, proposal)
        assert rows is not None
        return distributed.agreement_of(rows)

    def train(
        self, rollouts: list[list[wire.Rollout]], member_samples: list[int], batch_rollouts: int
    ) -> tuple[dict[str, float], list[int]]:
        if self.staged is not None:  # gathered with the agreement: every rank's, `rollouts` among them
            staged, self.staged = self.staged, None
            return self.train_on(staged, None, member_samples, batch_rollouts)
        slots = batch_rollouts * self.run_cfg.num_envs
        batch = ppo.join_rollouts(rollouts, self.spec, self.run_cfg.rollout_length, slots, self.device)
        returns = (
            None
            if self.reward_scaler is None
            else self.reward_scaler.running_returns(rollouts, batch.rewards.shape, self.hp.gamma.tolist())
        )
        if self.replicated:
            batch, returns, _ = self.gather(batch, returns)
        return self.train_on(batch, returns, member_samples, batch_rollouts)

    def train_on(
        self, batch: ppo.Batch, returns: torch.Tensor | None, member_samples: list[int], batch_rollouts: int
    ) -> tuple[dict[str, float], list[int]]:
        """`train` on a joined `batch` (every rank's, for replicas) and its rewards' running returns."""
        cfg = ppo.for_batch(self.cfg, batch_rollouts)
        samples = torch.tensor(member_samples, device=self.device)
        active = samples > 0
        anneal = torch.tensor([ppo.annealed(cfg, t, self.horizon) for t in self.trained], device=self.device)
        across_ranks = not self.replicated  # a replica holds every rank's data
        # Statistics first, as SB3's VecNormalize updates them before it normalizes the step.
        self.obs_norm.update(batch.obs[:, :-1].flatten(1, 2), batch.valid.flatten(1), across_ranks)
        batch = batch._replace(obs=self.obs_norm(batch.obs))
        if self.reward_scaler is not None:
            assert returns is not None
            batch = batch._replace(rewards=self.reward_scaler.scale(returns, batch.valid, batch.rewards, across_ranks))
        plan = [
            None if idx is None else idx.to(self.device)
            for idx in ppo.minibatch_plan(batch.valid[0].numel(), cfg, self.generator)
        ]
        norm = ppo.loss_normalizers(samples, cfg.minibatches, 1 if self.replicated else self.world_size)
        stats = ppo.update(
            self.model, self.core, self.optimizer, batch, self.hp, cfg, plan, anneal, norm, active, self.captured
        )
        updated = [int(m) for m in active.nonzero().flatten().tolist()]
        for member in updated:
            self.trained[member] += member_samples[member]
        return stats, updated

    def gather(
        self, batch: ppo.Batch, returns: torch.Tensor | None, proposal: torch.Tensor | None = None
    ) -> tuple[ppo.Batch, torch.Tensor | None, torch.Tensor | None]:
        """Every rank's batch (and reward returns) joined along the slot axis, in one all-gather
        that also carries each rank's `proposal` (returned as rows) and compares the replicas'
        fingerprints: rank 0's state everywhere if they differ."""
        fields = [*batch, *([] if returns is None else [returns])]
        state = [
            self.core.flat,
            self.optimizer.exp_avg,
            self.optimizer.exp_avg_sq,
            self.optimizer.steps,
            self.obs_norm.mean,
            self.obs_norm.var,
            self.obs_norm.count,
            *(
                []
                if self.reward_scaler is None
                else [getattr(self.reward_scaler.moments, name) for name in self.reward_scaler.moments.STATE]
            ),
        ]
        joined, rows, differed = replicas.gather_checked(fields, state, self.generator, proposal)
        self.resyncs += differed
        return ppo.Batch(*joined[: len(batch)]), (joined[-1] if returns is not None else None), rows


MakeTrainer = Callable[[EnvSpec, RunConfig, tuple[wire.Weights, ...], int, int, torch.device], Trainer]


def from_replay(algorithm: Callable[[EnvSpec, RunConfig, torch.device], OffPolicy]) -> MakeTrainer:
    """An off-policy algorithm's trainer: the algorithm, fed from this rank's replay shard."""

    def make(
        spec: EnvSpec,
        run_cfg: RunConfig,
        weights: tuple[wire.Weights, ...],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> Trainer:
        return OffPolicyTrainer(algorithm(spec, run_cfg, device), spec, run_cfg, weights, rank, world_size, device)

    return make


# Each algorithm's trainer (algorithms.ALGORITHMS): (env spec, run config, the members' last published
# weights, rank, world size, device) → trainer.
TRAINERS: dict[str, MakeTrainer] = {
    "ppo": PPOTrainer,
    "sac": from_replay(lambda spec, run_cfg, device: SAC(spec, run_cfg.sac, run_cfg.population, device)),
    "td3": from_replay(lambda spec, run_cfg, device: TD3(spec, run_cfg.td3, run_cfg.population, device)),
    "dqn": from_replay(
        lambda spec, run_cfg, device: DQN(spec, run_cfg.dqn, run_cfg.population, device, run_cfg.encoder_for(spec))
    ),
}


def make_trainer(
    spec: EnvSpec,
    run_cfg: RunConfig,
    weights: tuple[wire.Weights, ...],
    rank: int,
    world_size: int,
    device: torch.device,
) -> Trainer:
    return TRAINERS[run_cfg.algo](spec, run_cfg, weights, rank, world_size, device)
