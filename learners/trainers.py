"""What a learner rank trains, behind one interface: PPO on fresh rollouts, SAC, TD3 and DQN from
replay (learners/offpolicy.py); `TRAINERS` names each algorithm's.

The learner service (learner.py) owns sockets, credits, the agreement and PBT bookkeeping; each
iteration it hands the trainer the rollouts every rank agreed to consume, and the trainer updates
the whole population. A trainer is created after the torch.distributed world is up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from rlmq.common import wire
from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import distributed, minibatching, ppo
from rlmq.learners.dqn import DQN
from rlmq.learners.offpolicy import OffPolicy, OffPolicyTrainer
from rlmq.learners.onpolicy import OnPolicyTrainer
from rlmq.learners.r2d2 import R2D2
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

    def grow_member(self, member: int, before: tuple[int, ...], after: tuple[int, ...], seed: int) -> None:
        """PBT's node mutation gave `member` more hidden units (learners/shapes.py)."""
        ...

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

    def owes_steps(self) -> bool:
        """Whether the next iteration pays steps owed from the last (off-policy's chunked update)
        rather than taking new data; the same on every rank."""
        ...

    def nonfinite_skipped(self) -> int:
        """Member steps skipped so far because the gradient was not finite (learners/optim.py)."""
        ...


class PPOTrainer(OnPolicyTrainer):
    """PPO with V-trace targets (learners/ppo.py) in the on-policy shell (learners/onpolicy.py)."""

    HYPERPARAMS = ppo.MemberHyperparams
    cfg: PPOConfig

    def steps_per_update(self) -> int:
        return self.cfg.epochs * self.cfg.minibatches

    def capture(self, sync: Callable[[torch.Tensor], None]) -> ppo.CapturedSteps | None:
        return None if self.run_config.compile_update == "off" else ppo.capture(self.run_config.compile_update, sync)

    def update(
        self,
        batch: ppo.Batch,
        member_samples: list[int],
        batch_rollouts: int,
        samples: torch.Tensor,
        active: torch.Tensor,
    ) -> dict[str, float]:
        cfg = minibatching.for_batch(self.cfg, batch_rollouts)
        anneal = torch.tensor([ppo.annealed(cfg, t, self.horizon) for t in self.trained], device=self.device)
        plan = [
            None if idx is None else idx.to(self.device)
            for idx in minibatching.minibatch_plan(
                minibatching.plan_size(cfg, batch.valid, self.core.recurrent), cfg, self.generator
            )
        ]
        norm = ppo.loss_normalizers(samples, cfg.minibatches, 1 if self.replicated else self.world_size)
        return ppo.update(
            self.model, self.core, self.optimizer, batch, self.hp, cfg, plan, anneal, norm, active, self.captured
        )


MakeTrainer = Callable[[EnvSpec, RunConfig, tuple[wire.Weights, ...], int, int, torch.device], Trainer]


def from_replay(algorithm: Callable[[EnvSpec, RunConfig, torch.device], OffPolicy]) -> MakeTrainer:
    """An off-policy algorithm's trainer: the algorithm, fed from this rank's replay shard."""

    def make(
        spec: EnvSpec,
        run_config: RunConfig,
        weights: tuple[wire.Weights, ...],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> Trainer:
        return OffPolicyTrainer(
            algorithm(spec, run_config, device), spec, run_config, weights, rank, world_size, device
        )

    return make


# Each algorithm's trainer (algorithms.ALGORITHMS): (env spec, run config, the members' last published
# weights, rank, world size, device) → trainer.
TRAINERS: dict[str, MakeTrainer] = {
    "ppo": PPOTrainer,
    "sac": from_replay(lambda spec, run_config, device: SAC(spec, run_config.sac, run_config.population, device)),
    "td3": from_replay(lambda spec, run_config, device: TD3(spec, run_config.td3, run_config.population, device)),
    "dqn": from_replay(
        lambda spec, run_config, device: (
            DQN(spec, run_config.dqn, run_config.population, device, run_config.encoder_for(spec))
            if run_config.core == "identity"
            else R2D2(
                spec,
                run_config.dqn,
                run_config.population,
                device,
                run_config.encoder_for(spec),
                run_config.core,
                run_config.core_size,
            )
        )
    ),
}


def make_trainer(
    spec: EnvSpec,
    run_config: RunConfig,
    weights: tuple[wire.Weights, ...],
    rank: int,
    world_size: int,
    device: torch.device,
) -> Trainer:
    # Where PBT changes widths, every member's networks are allocated the widest (learners/shapes.py).
    return TRAINERS[run_config.algo](spec, run_config.allocated(), weights, rank, world_size, device)
