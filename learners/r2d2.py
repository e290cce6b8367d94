"""R2D2 (Kapturowski et al. 2019): DQN with a recurrent core, trained from replayed sequences.

Actors ship each rollout with every slot's core state at its first step (common/wire.py); the
replay keeps each slot's rollout whole, with that state (`SequenceReplay`: R2D2's stored state).
A batch is `batch_size` sequences per member. The online network's state is warmed over each
sequence's first `burn_in` steps without a gradient (R2D2's burn-in: the stored state was computed
by older weights), then DQN's double-Q loss (learners/dqn.py) is taken over the rest, n-step
returns included; the target network runs the whole sequence from the stored state. The loss is
each member's mean over the valid steps after the burn-in. Target updates, ε, the optimizer and
PBT copies are DQN's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlmq.common.algorithms import DQNConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import cores
from rlmq.learners.dqn import DQN, double_q_target
from rlmq.learners.networks import Stacked
from rlmq.learners.sequence_replay import Sequences


class R2D2(DQN):
    """DQN's networks with a recurrent core, its loss over replayed sequences (`Sequences`)."""

    def __init__(
        self, spec: EnvSpec, cfg: DQNConfig, population: int, device: torch.device, encoder: str, core: str, size: int
    ) -> None:
        super().__init__(spec, cfg, population, device, encoder, core, size)
        self.core, self.burn_in = core, cfg.burn_in

    def sequence_values(self, network: Stacked, obs: Tensor, state: Tensor, starts: Tensor) -> Tensor:
        """Q of every action [P, R, B, A] for features [P, R, B, obs_size] unrolled from `state`."""
        population, rows, slots, _ = obs.shape
        x = network.encode(obs.flatten(1, 2)).view(population, rows, slots, -1)
        h, _ = cores.unroll(self.core, x, state, starts, network.core_weights())
        return network.mlp(self.layers, h.flatten(1, 2)).view(population, rows, slots, -1)

    def loss(self, batch: Sequences, gamma: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        """(each member's loss [P], its weight applied; Q of the learned steps' actions [P, n])."""
        burn, steps = self.burn_in, batch.actions.shape[1]
        starts = cores.episode_starts(batch.valid)  # [P, T + 1, B]
        with torch.no_grad():
            target_q = self.sequence_values(self.target, batch.obs, batch.core_state, starts)[:, burn:]
            state = batch.core_state
            if burn:  # the online network's own state where the loss begins
                x = self.q.encode(batch.obs[:, :burn].flatten(1, 2)).view(
                    *batch.obs.shape[:1], burn, *state.shape[1:2], -1
                )
                _, state = cores.unroll(self.core, x, state, starts[:, :burn], self.q.core_weights())
        online = self.sequence_values(self.q, batch.obs[:, burn:], state, starts[:, burn:])  # [P, T + 1 − burn, B, A]
        learned = steps - burn
        rows = torch.arange(learned, device=online.device).view(1, learned, 1)
        horizon = batch.horizon[:, burn:]
        boot = (rows + horizon).clamp(max=learned).unsqueeze(-1).expand(-1, -1, -1, online.shape[-1])
        target = double_q_target(
            batch.returns[:, burn:].flatten(1),
            batch.terminated[:, burn:].flatten(1),
            online.detach().gather(1, boot).flatten(1, 2),
            target_q.gather(1, boot).flatten(1, 2),
            gamma,
            horizon.flatten(1).to(online.dtype),
        )
        q = online[:, :learned].gather(-1, batch.actions[:, burn:].unsqueeze(-1)).flatten(1)
        mask = batch.valid[:, burn:].flatten(1).to(q.dtype)
        huber = nn.functional.smooth_l1_loss(q, target, reduction="none")
        loss = (huber * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return loss * weight, q

    def capture(self, mode: str, backend: str = "") -> None:
        raise ValueError('a recurrent core trains eagerly: set compile_update = "off"')
