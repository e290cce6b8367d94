"""Twin delayed DDPG for a population, vectorized over members (Fujimoto et al. 2018).

A deterministic actor, twin critics, and Polyak-averaged target copies of both. The critics learn
towards r + γ·min Q'(s', μ'(s') + clipped noise) — target policy smoothing, with the smaller of the
twin targets — every gradient step; the actor (ascending Q1) and the targets move only every
`policy_delay` critic steps. Every network holds all P members (`Stacked`), so one gradient step
updates the whole population, each member with its own learning rate, discount and τ.

With `shared_critic` the critics and their target hold one member that all P actors share
(CEM-RL, DvD): its loss is the mean of the members' losses (each towards its own target actor's
smoothed action, with its own γ) over the members with data here, and it learns at the members'
mean learning rate and τ; each actor ascends the shared Q1 as before.

With `diversity_weight` λ > 0 (DvD, Parker-Holder et al. 2020) the actors' step also descends
λ·(−log det K) over the members' actions on one set of states, shared by all: the first ⌈B/P⌉
states of every member's batch. The determinant (`behavioural_diversity`) is reported with the
losses as "diversity" for every population, the term on or off, so that the two can be compared.

Inside the learner actions live in [-1, 1]; actors scale them to the env's bounds and add the
exploration noise (`common/models.py`, `DeterministicPolicy`); transitions are scaled back here.

As in learners/sac.py, several learner ranks share no DDP wrapper: after each backward the
gradient of the one network that loss trains is averaged across ranks (`sync`) before its own
optimizer steps. The step counter that delays the actor lives here and advances once per `step`,
which every rank calls equally often, so all ranks update their actors at the same steps.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.algorithms import TD3Config
from rlmq.common.models import scale_and_bias
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
    """`policy` outputs one pre-tanh value per action dimension (the actors read these names)."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.policy = relu_mlp([spec.obs_size, *hidden, spec.action_dim])


def smoothed_target_action(target_action: Tensor, noise: Tensor, target_noise: float, noise_clip: float) -> Tensor:
    """Target policy smoothing: clip(μ'(s') + clip(σ·ε, −c, c), −1, 1), with ε ~ N(0, 1) given."""
    return (target_action + (target_noise * noise).clamp(-noise_clip, noise_clip)).clamp(-1.0, 1.0)


def critic_target(
    reward: Tensor, terminated: Tensor, next_q1: Tensor, next_q2: Tensor, gamma: Tensor, horizon: Tensor
) -> Tensor:
    """y = r + γ^k·(1 − terminated)·min(Q1', Q2')(s', ã); [P, B] (n-step returns when k > 1),
    per-member γ [P], k [P, B]."""
    return reward + gamma[:, None] ** horizon * (1 - terminated) * torch.min(next_q1, next_q2)


def critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> Tensor:
    """Per member [P]: the two critics' mean squared errors, summed (each critic its own, as SB3)."""
    return ((q1 - target) ** 2).mean(-1) + ((q2 - target) ** 2).mean(-1)


def actor_loss(q1: Tensor) -> Tensor:
    """Per member [P]: −E[Q1(s, μ(s))] (the paper's deterministic policy gradient through Q1)."""
    return -q1.mean(-1)


class TD3:
    """The population's networks and optimizers, and one gradient step of all of them."""

    # What a checkpoint saves (learners/checkpoint.py).
    STATE = (
        "actor",
        "critic",
        "target_actor",
        "target_critic",
        "optimizers",
        "critic_steps",
        "last_actor_loss",
        "actor_trained",
        "diversity_weight",
    )

    def __init__(self, spec: EnvSpec, cfg: TD3Config, population: int, device: torch.device) -> None:
        self.cfg, self.population, self.n_step = cfg, population, cfg.n_step
        critics = 1 if cfg.shared_critic else population
        activation = cast(Activation, cfg.activation)
        self.actor = Stacked([Actor(spec, cfg.hidden_sizes) for _ in range(population)], activation=activation)
        self.critic = Stacked([Critic(spec, cfg.hidden_sizes) for _ in range(critics)], activation=activation)
        self.target_actor = Stacked([Actor(spec, cfg.hidden_sizes) for _ in range(population)], activation=activation)
        self.target_critic = Stacked([Critic(spec, cfg.hidden_sizes) for _ in range(critics)], activation=activation)
        for network in (self.actor, self.critic, self.target_actor, self.target_critic):
            network.to(device)
        with torch.no_grad():
            for target, online in ((self.target_actor, self.actor), (self.target_critic, self.critic)):
                target.flat.requires_grad_(False)
                target.flat.copy_(online.flat)
        self.optimizers = {
            "actor": PopulationAdam(self.actor.flat, eps=1e-8),
            "critic": PopulationAdam(self.critic.flat, eps=1e-8),
        }
        # The actors' mapping of [-1, 1] onto the env's bounds, so that replayed actions map back.
        self.action_scale, self.action_bias = (torch.from_numpy(a).to(device) for a in scale_and_bias(spec))
        self.policy_layers = self.actor.linear_names("policy")
        self.q_layers = {q: self.critic.linear_names(q) for q in ("q1", "q2")}
        self.critic_steps = 0  # gradient steps taken: the actor moves when it is a multiple of policy_delay
        self.last_actor_loss = torch.zeros(population, device=device)
        self.last_diversity = torch.zeros(population, device=device)  # det K at the last actor step
        self.actor_trained = torch.ones(population, dtype=torch.bool, device=device)  # CEM-RL: False for half
        # DvD's λ: the section's, or what the coordinator's bandit chose (a tensor, read by a captured step).
        self.diversity_weight = torch.tensor(cfg.diversity_weight, device=device)
        self.critic_loss_of, self.actor_loss_of, self.step_of = self.critic_loss, self.actor_loss, clip_then_step
        self.gradients_taken = False  # by the losses themselves, once captured

    def act(self, actor: Stacked, obs: Tensor) -> Tensor:
        """Each member's deterministic action in [-1, 1], [P, B, A]."""
        return torch.tanh(actor.mlp(self.policy_layers, obs))

    @torch.no_grad()
    def td_target(self, batch: Transitions, gamma: Tensor, noise: Tensor) -> Tensor:
        """The critics' target [P, B] from the target networks, with the smoothing noise `noise`
        (standard normal, [P, B, A]) passed in."""
        next_action = smoothed_target_action(
            self.act(self.target_actor, batch.next_obs), noise, self.cfg.target_noise, self.cfg.noise_clip
        )
        next_q1, next_q2 = q_pair(self.target_critic, self.q_layers, batch.next_obs, next_action)
        return critic_target(batch.rewards, batch.terminated, next_q1, next_q2, gamma, batch.horizon)

    def critic_loss(self, batch: Transitions, noise: Tensor, gamma: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        """(the critics' loss [P], `weight` [P] applied — a shared critic's [1], their mean over
        the weighted members; Q1 of the batch's actions [P, B])."""
        target = self.td_target(batch, gamma, noise)
        q1, q2 = q_pair(self.critic, self.q_layers, batch.obs, (batch.actions - self.action_bias) / self.action_scale)
        loss = critic_loss(q1, q2, target) * weight
        return pooled(loss, weight) if self.cfg.shared_critic else loss, q1

    def actor_loss(self, obs: Tensor, weight: Tensor) -> Tensor:
        """The actor's loss [P], `weight` applied (the critics held still by the caller), plus a
        P-th of DvD's term for each member when it is on."""
        q1_new, _ = q_pair(self.critic, self.q_layers, obs, self.act(self.actor, obs))
        loss = actor_loss(q1_new) * weight
        if self.cfg.diversity_weight > 0:
            term = diversity_loss(self.embeddings(obs), self.cfg.diversity_length_scale)
            loss = loss + self.diversity_weight * term / self.population
        return loss

    def embeddings(self, obs: Tensor) -> Tensor:
        """Every member's actions on the states all share, one row each [P, S·A]."""
        return embed(self.act(self.actor, shared_states(obs)))

    def capture(self, mode: str, backend: str = "") -> None:
        """Each loss with its gradient, and the optimizers' step, in `mode` (learners/capture.py)."""
        self.critic_loss_of = captured(
            with_gradient(compiled(self.critic_loss, mode, backend), lambda out: out[0].sum(), self.critic.flat), mode
        )
        self.actor_loss_of = captured(
            with_gradient(compiled(self.actor_loss, mode, backend), lambda loss: loss.sum(), self.actor.flat), mode
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
        """One gradient step of the critics; every `policy_delay`-th also one of the actor, then
        the Polyak step of both targets.

        `active` [P]: members that train (the same on every rank); `has_data` [P]: members this
        rank holds transitions of — the others' rows are zeros, and their losses here count 0.
        """
        weight = has_data.to(batch.rewards.dtype)
        noise = torch.randn(batch.actions.shape, generator=generator, device=batch.actions.device)
        lr = hp.learning_rate * decayed_fraction(
            self.optimizers["critic"].steps, self.cfg.lr_decay_steps, self.cfg.lr_final_fraction
        )
        critic, q1 = self.critic_loss_of(batch, noise, hp.gamma, weight)
        losses = {"critic": critic.expand(self.population)}
        critic_lr, critic_active, critic_tau = (
            shared_rates(lr, active, hp.tau) if self.cfg.shared_critic else (lr, active, hp.tau * active)
        )
        critic_descent = None if self.gradients_taken else critic
        descend(self.optimizers["critic"], critic_descent, critic_lr, critic_active, sync, self.step_of)
        self.critic_steps += 1

        if self.critic_steps % self.cfg.policy_delay == 0:
            self.critic.flat.requires_grad_(False)  # the actor's loss moves the actor only
            loss = self.actor_loss_of(batch.obs, weight)
            actor_active = active & self.actor_trained
            descend(
                self.optimizers["actor"], None if self.gradients_taken else loss, lr, actor_active, sync, self.step_of
            )
            self.last_actor_loss = loss.detach().clone()  # a captured loss's tensor: its next replay rewrites it
            if self.population > 1:
                with torch.no_grad():
                    diversity = behavioural_diversity(self.embeddings(batch.obs), self.cfg.diversity_length_scale)
                self.last_diversity.fill_(diversity.to(self.last_diversity.dtype))
            self.critic.flat.requires_grad_(True)
            with torch.no_grad():  # inactive members did not move: their targets need not either
                self.target_actor.flat.lerp_(self.actor.flat, (hp.tau * actor_active).unsqueeze(1))
                self.target_critic.flat.lerp_(self.critic.flat, critic_tau.unsqueeze(1))
        # The actor's loss of its latest step, so that a mean over steps is not diluted by the
        # steps in between that leave the actor alone.
        losses["actor"] = self.last_actor_loss
        stats = {**{f"{k}_loss": v.detach() for k, v in losses.items()}, "q": q1.detach().mean(-1)}
        if self.population > 1:
            stats["diversity"] = self.last_diversity
        return stats

    @property
    def policy_network(self) -> Stacked:
        return self.actor

    def member_params(self, member: int) -> dict[str, np.ndarray]:
        """What actors run: the actor network."""
        return self.actor.member_params(member)

    def load_member(self, member: int, params: dict[str, np.ndarray]) -> None:
        """A restarted world resumes the published actor; its target starts from it too."""
        self.actor.load_member(member, params)
        self.target_actor.load_member(member, params)

    def replicated(self) -> list[Tensor]:
        return [self.actor.flat, self.critic.flat, self.target_actor.flat, self.target_critic.flat]

    @torch.no_grad()
    def start_generation(self, actors: list[dict[str, np.ndarray]], trained: list[bool]) -> None:
        """CEM-RL: every member's actor and target actor become its draw, the actors' optimizer
        starts afresh, and only the `trained` members' actors learn until the next generation."""
        for member, params in enumerate(actors):
            self.load_member(member, params)
        self.optimizers["actor"].restart()
        self.actor_trained.copy_(torch.tensor(trained, device=self.actor_trained.device))

    def hyperparams(self, members: list[dict[str, float]], device: torch.device) -> ActorCriticHyperparams:
        return per_member(ActorCriticHyperparams, members, device)

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """PBT exploit: every network (online and target) and every optimizer's state, but a
        shared critic's, which is the target's already."""
        own = ("actor",) if self.cfg.shared_critic else ("actor", "critic")
        for name in own:
            for stacked in (getattr(self, name), getattr(self, f"target_{name}")):
                stacked.flat[target] = stacked.flat[source]
            self.optimizers[name].copy_member(source, target)
        self.last_actor_loss[target] = self.last_actor_loss[source]
