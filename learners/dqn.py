"""Deep Q-network for a population, vectorized over members (Mnih et al. 2015), with double-Q
targets (van Hasselt et al. 2016).

The Q network regresses, under the Huber loss, towards r + γ·Q_target(s', argmax_a Q(s', a)): the
online network picks the next action, the target network values it. Every `target_update_interval`
gradient steps the target moves towards the online network by a Polyak step τ (as SB3's DQN): τ = 1
is the hard copy of Mnih et al., a small τ every step the soft update of SAC/TD3. Optionally each
member's learning rate decays linearly over its first `lr_decay_steps` gradient steps (counted by its
Adam state, which PBT copies with its weights). Every network holds all P members (`Stacked`), so
one gradient step updates the whole population, each member with its own learning rate and discount.

The Q network is what actors run (`common/models.py`, `EpsilonGreedyPolicy`): its Linears are
`policy.{2i}` so that the actors' layer reader takes it as it is. ε comes from the member's env
steps, which travel with its weights.

As in learners/sac.py, several learner ranks share no DDP wrapper: after the backward the gradient
is averaged across ranks (`sync`), then clipped per member (clipping is not linear: it must see the
global gradient), then Adam steps. The step counter that times the target copies lives here and
advances once per `step`, which every rank calls equally often.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.algorithms import DQNConfig
from rlmq.common.images import encoded_size
from rlmq.common.schema import EnvSpec
from rlmq.learners import cores
from rlmq.learners.capture import captured, compiled, with_gradient
from rlmq.learners.encoders import ConvEncoder, encode, image_encoder
from rlmq.learners.networks import Memory, Stacked, recurrent_cell
from rlmq.learners.offpolicy import relu_mlp
from rlmq.learners.optim import (
    PopulationAdam,
    Sync,
    clip_and_step,
    clip_then_step,
    decayed_fraction,
    descend,
    per_member,
    written_by_step,
)
from rlmq.learners.replay import Transitions
from rlmq.learners.stacked_mlp import Activation


class QNetwork(nn.Module):
    """`policy` maps an observation to one value per action (named for the actors' reader), behind
    a convolutional `encoder` when the run encodes images (resolved: `RunConfig.encoder_for`) and a
    recurrent `core` (R2D2's: learners/r2d2.py) when the run has one."""

    def __init__(
        self, spec: EnvSpec, hidden: tuple[int, ...], encoder: str = "mlp", core: str = "identity", core_size: int = 0
    ) -> None:
        super().__init__()
        image = image_encoder(spec, encoder)
        if image is not None:  # first: its parameters lead the state dict, as the actors read it
            self.encoder = ConvEncoder(image)
        self.image = image
        width = encoded_size(spec, encoder)
        self.recurrent = core != "identity"
        if self.recurrent:
            self.core = recurrent_cell(core, width, core_size)
            width = core_size
        self.policy = relu_mlp([width, *hidden, spec.action_dim])

    def forward(self, obs: Tensor, memory: Memory | None = None) -> Tensor:
        """Q of every action for [R · N, obs_size] features, a recurrent network's unrolled from
        `memory` (the reference the stacked network is held to)."""
        x = obs if self.image is None else encode(self.encoder, self.image.layout, obs)
        if self.recurrent:
            assert memory is not None, "a recurrent network steps from each slot's state"
            rows, slots = memory.starts.shape
            x = cores.unroll_cell(self.core, x.view(rows, slots, -1), memory.state, memory.starts).flatten(0, 1)
        out: Tensor = self.policy(x)
        return out


def double_q_target(
    reward: Tensor, terminated: Tensor, next_q_online: Tensor, next_q_target: Tensor, gamma: Tensor, horizon: Tensor
) -> Tensor:
    """y = r + γ^k·(1 − terminated)·Q_target(s', argmax_a Q_online(s', a)); next Qs [P, B, A],
    rewards [P, B] (n-step returns when k > 1), per-member γ [P], k [P, B]."""
    next_action = next_q_online.argmax(-1, keepdim=True)
    next_value = next_q_target.gather(-1, next_action).squeeze(-1)
    return reward + gamma[:, None] ** horizon * (1 - terminated) * next_value


def q_loss(q: Tensor, target: Tensor) -> Tensor:
    """Per member [P]: the mean Huber loss (smooth L1, δ = 1, as SB3) of Q(s, a) against y."""
    return nn.functional.smooth_l1_loss(q, target, reduction="none").mean(-1)


class DQNHyperparams(NamedTuple):
    learning_rate: Tensor  # [P]
    gamma: Tensor


class DQN:
    """The population's Q and target networks and optimizer, and one gradient step of all of them."""

    STATE = ("q", "target", "optimizers", "steps")  # what a checkpoint saves (learners/checkpoint.py)

    def __init__(
        self,
        spec: EnvSpec,
        cfg: DQNConfig,
        population: int,
        device: torch.device,
        encoder: str = "mlp",
        core: str = "identity",
        core_size: int = 0,
    ) -> None:
        self.cfg, self.population = cfg, population
        image = image_encoder(spec, encoder)
        self.q, self.target = (
            Stacked(
                [QNetwork(spec, cfg.hidden_sizes, encoder, core, core_size) for _ in range(population)],
                image,
                cast(Activation, cfg.activation),
            ).to(device)
            for _ in range(2)
        )
        self.target.flat.requires_grad_(False)
        with torch.no_grad():
            self.target.flat.copy_(self.q.flat)
        self.optimizers = {"q": PopulationAdam(self.q.flat, eps=1e-8)}
        self.max_grad_norm = (
            None if cfg.max_grad_norm is None else torch.full((population,), cfg.max_grad_norm, device=device)
        )
        self.layers = self.q.linear_names("policy")
        self.steps = 0  # gradient steps taken: the target is refreshed when it is a multiple of the interval
        self.n_step = cfg.n_step
        self.loss_of, self.step_of = self.loss, clip_then_step  # eager until `capture`
        self.gradients_taken = False  # by the loss itself, once captured

    def values(self, network: Stacked, obs: Tensor) -> Tensor:
        """Q of every action, [P, B, n]."""
        return network.mlp(self.layers, network.encode(obs))

    @torch.no_grad()
    def td_target(self, reward: Tensor, terminated: Tensor, next_obs: Tensor, gamma: Tensor, horizon: Tensor) -> Tensor:
        return double_q_target(
            reward, terminated, self.values(self.q, next_obs), self.values(self.target, next_obs), gamma, horizon
        )

    def loss(self, batch: Transitions, gamma: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        """(each member's loss [P], its weight [P] applied; Q of the batch's actions [P, B])."""
        target = self.td_target(batch.rewards, batch.terminated, batch.next_obs, gamma, batch.horizon)
        q = self.values(self.q, batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        return q_loss(q, target) * weight, q

    def capture(self, mode: str, backend: str = "") -> None:
        """The loss with its gradient, and the optimizer's step, in `mode` (learners/capture.py)."""
        self.loss_of = captured(
            with_gradient(compiled(self.loss, mode, backend), lambda out: out[0].sum(), self.q.flat), mode
        )
        self.step_of = captured(compiled(clip_and_step, mode, backend), mode, written_by_step)
        self.gradients_taken = True

    def step(
        self,
        batch: Transitions,
        hp: DQNHyperparams,
        active: Tensor,
        has_data: Tensor,
        sync: Sync,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        """One gradient step of the Q network; every `target_update_interval`-th step then moves the
        target towards it by τ (active members only: the others did not move).

        `active` [P]: members that train (the same on every rank); `has_data` [P]: members this
        rank holds transitions of — the others' rows are zeros, and their losses here count 0.
        `generator` is unused: nothing here is random.
        """
        loss, q = self.loss_of(batch, hp.gamma, has_data.to(torch.float32))
        optimizer = self.optimizers["q"]
        lr = hp.learning_rate * decayed_fraction(optimizer.steps, self.cfg.lr_decay_steps, self.cfg.lr_final_fraction)
        norms = descend(
            optimizer, None if self.gradients_taken else loss, lr, active, sync, self.step_of, self.max_grad_norm
        )
        stats = {"q_loss": loss.detach(), "q": q.detach().mean(-1)}
        if self.max_grad_norm is not None:
            stats["grad_norm"] = norms
        self.steps += 1
        if self.steps % self.cfg.target_update_interval == 0:
            with torch.no_grad():
                moved = self.target.flat.lerp(self.q.flat, self.cfg.tau) if self.cfg.tau < 1 else self.q.flat
                self.target.flat.copy_(torch.where(active.unsqueeze(1), moved, self.target.flat))
        return stats

    @property
    def policy_network(self) -> Stacked:
        return self.q

    def member_params(self, member: int) -> dict[str, np.ndarray]:
        """What actors run: the Q network."""
        return self.q.member_params(member)

    def load_member(self, member: int, params: dict[str, np.ndarray]) -> None:
        """A restarted world resumes the published Q network; its target starts from it too."""
        self.q.load_member(member, params)
        self.target.load_member(member, params)

    def replicated(self) -> list[Tensor]:
        return [self.q.flat, self.target.flat]

    def hyperparams(self, members: list[dict[str, float]], device: torch.device) -> DQNHyperparams:
        return per_member(DQNHyperparams, members, device)

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """PBT exploit: the Q and target networks and the optimizer's state."""
        for stacked in (self.q, self.target):
            stacked.flat[target] = stacked.flat[source]
        self.optimizers["q"].copy_member(source, target)
