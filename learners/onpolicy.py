"""The on-policy trainer's shell, as SB3's `OnPolicyAlgorithm` is (an algorithm is its `update`):
the population's actor-critic, observation statistics and reward scaling, the learner ranks kept
in step (DDP, or replicas that gather every rank's batch: learners/replicas.py), the rollouts of
an update joined into one batch, and each member's trained env steps. PPO (learners/trainers.py,
`PPOTrainer`) is `update` and its hyperparameters; an A2C would be its own `update`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rlmq.common import wire
from rlmq.common.algorithms import OnPolicyConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import distributed, ppo, replicas
from rlmq.learners.networks import PopulationActorCritic
from rlmq.learners.normalization import ObsNormalizer, RewardScaler
from rlmq.learners.offpolicy import allreduce_mean
from rlmq.learners.optim import PopulationAdam, per_member
from rlmq.learners.shapes import set_member_shapes
from rlmq.learners.stacked_mlp import Activation

Params = dict[str, np.ndarray]


def copy_member(core: PopulationActorCritic, optimizer: PopulationAdam, decision: wire.Decision) -> None:
    """PBT exploit for PPO: target ← source, weights and optimizer state, plus the decision's noise."""
    with torch.no_grad():
        core.flat[decision.target] = core.flat[decision.source]
    core.add_noise(decision.target, decision.param_noise, decision.id)
    optimizer.copy_member(decision.source, decision.target)


class OnPolicyTrainer:
    """The shell: see the module's docstring. A subclass names its hyperparameters (`HYPERPARAMS`,
    a NamedTuple of [P] tensors with at least `gamma`) and implements `update`; it may capture its
    update (`capture`) and say how many gradient steps an update takes (`steps_per_update`)."""

    HYPERPARAMS: type[Any]
    STATE = ("core", "optimizer", "obs_norm", "reward_scaler", "generator", "trained")  # learners/checkpoint.py

    def __init__(
        self,
        spec: EnvSpec,
        run_config: RunConfig,
        weights: tuple[wire.Weights, ...],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        section = run_config.algo_config
        assert isinstance(section, OnPolicyConfig), f"{run_config.algo} is not an on-policy algorithm"
        self.spec, self.run_config, self.cfg, self.device = spec, run_config, section, device
        self.world_size, population = world_size, run_config.population
        self.core = PopulationActorCritic(
            spec,
            run_config.hidden_sizes,
            population,
            self.cfg.log_std_init,
            run_config.encoder_for(spec),
            cast(Activation, self.cfg.activation),
            run_config.core,
            run_config.core_size,
        ).to(device)
        self.core.allocated_wider = run_config.mutates_layers  # members of mutated widths or depth publish them trimmed
        self.obs_norm = ObsNormalizer(population, spec.obs_size, run_config.obs_clip, device, run_config.normalize_obs)
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
                self.steps_per_update(),
                lambda: replicas.measure(self.core, spec, run_config, device),
            )
            == "batch"
        )
        sync = (lambda grad: None) if self.replicated else allreduce_mean
        self.captured = self.capture(sync)
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
        self.generator = torch.Generator().manual_seed(run_config.seed * 1000 + (0 if self.replicated else rank))
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
        self.horizon = max(run_config.total_steps // population, 1)

    def member_params(self, member: int) -> Params:
        return {**self.core.member_params(member), **self.obs_norm.member_params(member)}

    def trained_steps(self, member: int) -> int:
        return self.trained[member]

    def load_member(self, member: int, params: Params) -> None:
        self.core.load_member(member, self.obs_norm.load_member(member, params))

    def set_hyperparams(self, hyperparams: list[dict[str, float]]) -> None:
        self.hp = per_member(self.HYPERPARAMS, hyperparams, self.device)
        set_member_shapes([self.core], [self.optimizer], hyperparams)

    def grow_member(self, member: int, before: tuple[int, ...], after: tuple[int, ...], seed: int) -> None:
        """PBT's node mutation gave `member` more units (learners/shapes.py, `grow`)."""
        self.core.grow(member, before, after, seed)

    def steps_per_update(self) -> int:
        """Gradient steps an update takes (what DDP's collectives are counted in: replicas.choose)."""
        return 1

    def capture(self, sync: Callable[[torch.Tensor], None]) -> Any:
        """The algorithm's update captured by torch.compile (`RunConfig.compile_update`), or None:
        eager. `sync` all-reduces a gradient between captured steps (None: replicas, no one does)."""
        return None

    def update(
        self,
        batch: ppo.Batch,
        member_samples: list[int],
        batch_rollouts: int,
        samples: torch.Tensor,
        active: torch.Tensor,
    ) -> dict[str, float]:
        """The algorithm: one update of every `active` member on `batch` (observations normalized,
        rewards scaled), `samples` env steps each; the losses it reports."""
        raise NotImplementedError

    def copy_member(self, decision: wire.Decision) -> None:
        copy_member(self.core, self.optimizer, decision)
        self.obs_norm.copy_member(decision.source, decision.target)
        if self.reward_scaler is not None:
            self.reward_scaler.moments.copy_member(decision.source, decision.target)
        self.trained[decision.target] = self.trained[decision.source]
        if self.staged is not None:  # the target's gathered data are its old policy's: not trained on
            self.staged.valid[decision.target] = False

    def owes_steps(self) -> bool:
        return False  # an on-policy update takes its whole batch at once

    def nonfinite_skipped(self) -> int:
        return int(self.optimizer.nonfinite)

    def agree(self, proposal: torch.Tensor, batch: Callable[[], list[list[wire.Rollout]]]) -> distributed.Agreement:
        if not self.agrees_in_gather:
            return distributed.agreement(proposal)
        slots = self.cfg.rollouts_per_batch * self.run_config.num_envs
        joined = ppo.join_rollouts(
            batch(), self.spec, self.run_config.rollout_length, slots, self.device, self.run_config.core_state_size
        )
        self.staged, _, rows = self.gather(joined, None, proposal)
        assert rows is not None
        return distributed.agreement_of(rows)

    def train(
        self, rollouts: list[list[wire.Rollout]], member_samples: list[int], batch_rollouts: int
    ) -> tuple[dict[str, float], list[int]]:
        if self.staged is not None:  # gathered with the agreement: every rank's, `rollouts` among them
            staged, self.staged = self.staged, None
            return self.train_on(staged, None, member_samples, batch_rollouts)
        slots = batch_rollouts * self.run_config.num_envs
        batch = ppo.join_rollouts(
            rollouts, self.spec, self.run_config.rollout_length, slots, self.device, self.run_config.core_state_size
        )
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
        samples = torch.tensor(member_samples, device=self.device)
        active = samples > 0
        across_ranks = not self.replicated  # a replica holds every rank's data
        # Statistics first, as SB3's VecNormalize updates them before it normalizes the step.
        self.obs_norm.update(batch.obs[:, :-1].flatten(1, 2), batch.valid.flatten(1), across_ranks)
        batch = batch._replace(obs=self.obs_norm(batch.obs))
        if self.reward_scaler is not None:
            assert returns is not None
            batch = batch._replace(rewards=self.reward_scaler.scale(returns, batch.valid, batch.rewards, across_ranks))
        stats = self.update(batch, member_samples, batch_rollouts, samples, active)
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
