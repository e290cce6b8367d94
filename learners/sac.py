"""Soft actor-critic for a population, vectorized over members (Haarnoja et al. 2018b).

A squashed-Gaussian policy, twin critics with Polyak-averaged target copies, and a temperature α
tuned towards a target entropy. Every network holds all P members (`Stacked`), so one gradient
step updates the whole population, each member with its own learning rate, discount and τ.

Inside the learner actions live in [-1, 1]; actors scale them to the env's bounds
(`common/models.py`), and transitions from the replay are scaled back here.

Under several learner ranks there is no DDP wrapper: after each backward the gradient of the one
network that loss trains is averaged across ranks (`sync`) before its own optimizer steps — each of
the three optimizers is synced on its own (the lesson of Horovod's distributed SAC).

With `shared_critic` the critics hold one member for the population (their loss the members'
mean: learners/td3.py says how); each member keeps its own temperature. With `diversity_weight`
λ > 0 the actors' loss adds DvD's λ·(−log det K) over the members' squashed means on shared states
(learners/diversity.py); every population reports det K as "diversity".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.algorithms import SACConfig
from rlmq.common.models import (  # as the actors clamp and scale
    LOG_STD_MAX,
    LOG_STD_MIN,
    scale_and_bias,
)
from rlmq.common.schema import EnvSpec
from rlmq.learners.capture import captured, compiled, with_gradient
from rlmq.learners.diversity import behavioural_diversity, diversity_loss, embed, shared_states
from rlmq.learners.networks import Stacked
from rlmq.learners.offpolicy import ActorCriticHyperparams, Critic, pooled, q_pair, relu_mlp, shared_rates
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


class Actor(nn.Module):
    """`policy` outputs the mean and log-std of each action dimension, side by side."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.policy = relu_mlp([spec.obs_size, *hidden, 2 * spec.action_dim])


def squashed_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """(tanh(mean + std·noise), its log-probability summed over action dimensions), with the
    change-of-variables term of the tanh (SAC paper, appendix C)."""
    log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    pre_tanh = mean + log_std.exp() * noise
    action = torch.tanh(pre_tanh)
    gaussian = -0.5 * noise * noise - log_std - 0.5 * math.log(2 * math.pi)
    # log(1 − tanh²(u)) = 2·(log 2 − u − softplus(−2u)), stable where tanh saturates
    squash = 2 * (math.log(2) - pre_tanh - nn.functional.softplus(-2 * pre_tanh))
    return action, (gaussian - squash).sum(-1)


def critic_target(
    reward: Tensor, terminated: Tensor, next_q: Tensor, next_logp: Tensor, alpha: Tensor, gamma: Tensor, horizon: Tensor
) -> Tensor:
    """y = r + γ^k·(1 − terminated)·(min Q'(s', a') − α·log π(a'|s')); [P, B] (n-step returns when
    k > 1), per-member α, γ [P], k [P, B]."""
    return reward + gamma[:, None] ** horizon * (1 - terminated) * (next_q - alpha[:, None] * next_logp)


def critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> Tensor:
    """Per member [P]: mean squared error of both critics (as SB3: ½ Σ over the two, ×2 folded in)."""
    return 0.5 * (((q1 - target) ** 2).mean(-1) + ((q2 - target) ** 2).mean(-1))


def actor_loss(logp: Tensor, q: Tensor, alpha: Tensor) -> Tensor:
    """Per member [P]: E[α·log π(a|s) − min Q(s, a)], a ~ π."""
    return (alpha[:, None] * logp - q).mean(-1)


def temperature_loss(log_alpha: Tensor, logp: Tensor, target_entropy: float) -> Tensor:
    """Per member [P]: −log α · E[log π + H̄] (gradient raises α when entropy is below target)."""
    return -(log_alpha[:, None] * (logp.detach() + target_entropy)).mean(-1)


class SAC:
    """The population's networks and optimizers, and one gradient step of all of them."""

    # What a checkpoint saves (learners/checkpoint.py).
    STATE = ("actor", "critic", "target", "log_alpha", "optimizers", "actor_trained", "diversity_weight")

    def __init__(self, spec: EnvSpec, cfg: SACConfig, population: int, device: torch.device) -> None:
        self.cfg, self.population, self.n_step = cfg, population, cfg.n_step
        critics = 1 if cfg.shared_critic else population
        activation = cast(Activation, cfg.activation)
        self.actor = Stacked([Actor(spec, cfg.hidden_sizes) for _ in range(population)], activation=activation)
        self.critic = Stacked([Critic(spec, cfg.hidden_sizes) for _ in range(critics)], activation=activation)
        self.target = Stacked([Critic(spec, cfg.hidden_sizes) for _ in range(critics)], activation=activation)
        for network in (self.actor, self.critic, self.target):
            network.to(device)
        self.target.flat.requires_grad_(False)
        with torch.no_grad():
            self.target.flat.copy_(self.critic.flat)
        self.log_alpha = nn.Parameter(torch.full((population, 1), math.log(cfg.init_temperature), device=device))
        self.optimizers = {
            "actor": PopulationAdam(self.actor.flat, eps=1e-8),
            "critic": PopulationAdam(self.critic.flat, eps=1e-8),
            "temperature": PopulationAdam(self.log_alpha, eps=1e-8),
        }
        self.target_entropy = -float(spec.action_dim) if cfg.target_entropy is None else cfg.target_entropy
        # The actors' mapping of [-1, 1] onto the env's bounds, so that replayed actions map back.
        self.action_scale, self.action_bias = (torch.from_numpy(a).to(device) for a in scale_and_bias(spec))
        self.policy_layers, self.q_layers = (
            self.actor.linear_names("policy"),
            {q: self.critic.linear_names(q) for q in ("q1", "q2")},
        )
        self.critic_loss_of, self.actor_loss_of, self.step_of = self.critic_loss, self.actor_loss, clip_then_step
        self.temperature_loss_of = self.temperature_loss
        self.gradients_taken = False  # by the losses themselves, once captured
        self.actor_trained = torch.ones(population, dtype=torch.bool, device=device)  # CEM-RL: False for half
        # DvD's λ: the section's, or what the coordinator's bandit chose (a tensor, read by a captured step).
        self.diversity_weight = torch.tensor(cfg.diversity_weight, device=device)

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Actions in [-1, 1] [P, B, A] and their log-probabilities [P, B] under each member's
        policy, with the Gaussian's standard normal draws `noise` [P, B, A] given."""
        mean, log_std = self.actor.mlp(self.policy_layers, obs).chunk(2, dim=-1)
        return squashed_gaussian(mean, log_std, noise)

    def q(self, critic: Stacked, obs: Tensor, action: Tensor) -> Tensor:
        """min of the twin critics, [P, B]."""
        return torch.min(*q_pair(critic, self.q_layers, obs, action))

    def critic_loss(self, batch: Transitions, noise: Tensor, alpha: Tensor, gamma: Tensor, weight: Tensor) -> Tensor:
        """The critics' loss [P], `weight` [P] applied (a shared critic's [1]: `pooled`); `noise`
        for the next actions."""
        with torch.no_grad():
            next_action, next_logp = self.sample(batch.next_obs, noise)
            target = critic_target(
                batch.rewards,
                batch.terminated,
                self.q(self.target, batch.next_obs, next_action),
                next_logp,
                alpha,
                gamma,
                batch.horizon,
            )
        q1, q2 = q_pair(self.critic, self.q_layers, batch.obs, (batch.actions - self.action_bias) / self.action_scale)
        loss = critic_loss(q1, q2, target) * weight
        return pooled(loss, weight) if self.cfg.shared_critic else loss

    def actor_loss(self, obs: Tensor, noise: Tensor, alpha: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        """(the actor's loss [P], `weight` applied; log π of its fresh actions [P, B]), the
        critics held still by the caller."""
        new_action, logp = self.sample(obs, noise)
        loss = actor_loss(logp, self.q(self.critic, obs, new_action), alpha) * weight
        if self.cfg.diversity_weight > 0:  # DvD: a P-th of the term on each member's row
            term = diversity_loss(self.embeddings(obs), self.cfg.diversity_length_scale)
            loss = loss + self.diversity_weight * term / self.population
        return loss, logp

    def embeddings(self, obs: Tensor) -> Tensor:
        """Every member's deterministic action (the squashed mean) on the states all share, one
        row each [P, S·A]."""
        mean, _ = self.actor.mlp(self.policy_layers, shared_states(obs)).chunk(2, dim=-1)
        return embed(torch.tanh(mean))

    def temperature_loss(self, logp: Tensor, weight: Tensor) -> Tensor:
        """The temperature's loss [P], `weight` applied, from the actor's log π [P, B]."""
        return temperature_loss(self.log_alpha[:, 0], logp, self.target_entropy) * weight

    def capture(self, mode: str, backend: str = "") -> None:
        """Each loss with its gradient, and the optimizers' step, in `mode` (learners/capture.py)."""
        losses: list[tuple[Callable[..., Any], Tensor, Callable[[Any], Tensor]]] = [
            (self.critic_loss, self.critic.flat, lambda loss: loss.sum()),
            (self.actor_loss, self.actor.flat, lambda out: out[0].sum()),
            (self.temperature_loss, self.log_alpha, lambda loss: loss.sum()),
        ]
        self.critic_loss_of, self.actor_loss_of, self.temperature_loss_of = (
            captured(with_gradient(compiled(loss, mode, backend), total, param), mode) for loss, param, total in losses
        )
        self.step_of = captured(compiled(clip_and_step, mode, backend), mode, written_by_step)
        self.gradients_taken = True

    def step(
        self,
        batch: Transitions,
        hp: ActorCriticHyperparams,
        active: Tensor,
        has_data: Tensor,
        sync: Sync,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        """One gradient step of critics, actor and temperature, then the target critics' Polyak step.

        `active` [P]: members that train (the same on every rank); `has_data` [P]: members this
        rank holds transitions of — the others' rows are zeros, and their losses here count 0.
        """
        weight = has_data.to(batch.rewards.dtype)
        alpha = self.log_alpha.detach()[:, 0].exp()
        lr = hp.learning_rate * decayed_fraction(
            self.optimizers["critic"].steps, self.cfg.lr_decay_steps, self.cfg.lr_final_fraction
        )
        shape = (*batch.rewards.shape, self.action_scale.numel())  # the next actions', then the fresh ones'
        next_noise, noise = (torch.randn(shape, generator=generator, device=weight.device) for _ in range(2))
        taken = self.gradients_taken
        critic_lr, critic_active, critic_tau = (
            shared_rates(lr, active, hp.tau) if self.cfg.shared_critic else (lr, active, hp.tau * active)
        )
        critic = self.critic_loss_of(batch, next_noise, alpha, hp.gamma, weight)
        descend(self.optimizers["critic"], None if taken else critic, critic_lr, critic_active, sync, self.step_of)
        losses = {"critic": critic.expand(self.population)}

        self.critic.flat.requires_grad_(False)  # the actor's loss moves the actor only
        losses["actor"], logp = self.actor_loss_of(batch.obs, noise, alpha, weight)
        actor_active = active & self.actor_trained
        descend(self.optimizers["actor"], None if taken else losses["actor"], lr, actor_active, sync, self.step_of)
        self.critic.flat.requires_grad_(True)
        diversity = {}
        if self.population > 1:
            with torch.no_grad():
                found = behavioural_diversity(self.embeddings(batch.obs), self.cfg.diversity_length_scale)
            diversity["diversity"] = found.to(alpha.dtype).expand(self.population)

        losses["temperature"] = self.temperature_loss_of(logp, weight)
        descend(
            self.optimizers["temperature"], None if taken else losses["temperature"], lr, active, sync, self.step_of
        )
        with torch.no_grad():  # inactive members' critics did not move: their targets need not either
            self.target.flat.lerp_(self.critic.flat, critic_tau.unsqueeze(1))
        return {
            **{f"{k}_loss": v.detach() for k, v in losses.items()},
            "alpha": alpha,
            "entropy": -logp.detach().mean(-1),
            **diversity,
        }

    @property
    def policy_network(self) -> Stacked:
        return self.actor

    def member_params(self, member: int) -> dict[str, np.ndarray]:
        """What actors run: the policy network."""
        return self.actor.member_params(member)

    def load_member(self, member: int, params: dict[str, np.ndarray]) -> None:
        self.actor.load_member(member, params)

    def replicated(self) -> list[Tensor]:
        return [self.actor.flat, self.critic.flat, self.target.flat, self.log_alpha]

    @torch.no_grad()
    def start_generation(self, actors: list[dict[str, np.ndarray]], trained: list[bool]) -> None:
        """CEM-RL: every member's actor becomes its draw, the actors' optimizer starts afresh, and
        only the `trained` members' actors learn until the next generation (each keeps its
        temperature)."""
        for member, params in enumerate(actors):
            self.load_member(member, params)
        self.optimizers["actor"].restart()
        self.actor_trained.copy_(torch.tensor(trained, device=self.actor_trained.device))

    def hyperparams(self, members: list[dict[str, float]], device: torch.device) -> ActorCriticHyperparams:
        return per_member(ActorCriticHyperparams, members, device)

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """PBT exploit: every network, the temperature and every optimizer's state, but a shared
        critic's, which is the target's already."""
        own = [self.actor] if self.cfg.shared_critic else [self.actor, self.critic, self.target]
        for stacked in own:
            stacked.flat[target] = stacked.flat[source]
        self.log_alpha[target] = self.log_alpha[source]
        for name, optimizer in self.optimizers.items():
            if name != "critic" or not self.cfg.shared_critic:
                optimizer.copy_member(source, target)
