"""Asynchronous PPO with V-trace targets: the loss as a pure function, and one update step.

Data arrive from actors that acted with an older policy μ. Following decoupled PPO (Hilton et al.
2021), the *proximal* policy is the learner's policy at the start of the update, π_old: V-trace
corrects μ → π_old (clipped importance weights, in the advantages and value targets), and PPO's
clip keeps the epochs near π_old. With fresh data (μ = π_old) this is plain PPO.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.config import PPOConfig
from rlmq.common.wire import Rollout
from rlmq.learners.advantages import vtrace
from rlmq.learners.networks import ActorCritic


class Batch(NamedTuple):
    """Rollouts joined along the slot axis: time-major [T(+1), B, ...] tensors."""

    obs: Tensor
    actions: Tensor
    behaviour_logp: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    valid: Tensor


class PPOLoss(NamedTuple):
    total: Tensor
    pg_loss: Tensor
    v_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor


def join_rollouts(rollouts: list[Rollout], device: torch.device) -> Batch:
    def cat(name: str, dtype: np.dtype | None = None) -> Tensor:
        joined = np.concatenate([getattr(r, name) for r in rollouts], axis=1)
        return torch.from_numpy(joined if dtype is None else joined.astype(dtype)).to(device)

    return Batch(
        obs=cat("obs"),
        actions=cat("actions"),
        behaviour_logp=cat("logprobs"),
        rewards=cat("rewards"),
        terminated=cat("terminated"),
        truncated=cat("truncated"),
        valid=cat("valid"),
    )


def mean_or_zero(x: Tensor) -> Tensor:
    """Mean that is 0, not NaN, for an empty minibatch: every DDP rank must still backpropagate."""
    return x.sum() / max(x.numel(), 1)


def ppo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    new_values: Tensor,
    value_targets: Tensor,
    entropy: Tensor,
    *,
    clip_coef: float,
    ent_coef: float,
    vf_coef: float,
) -> PPOLoss:
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    pg_loss = mean_or_zero(torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)))
    v_loss = 0.5 * mean_or_zero((new_values - value_targets) ** 2)
    mean_entropy = mean_or_zero(entropy)
    with torch.no_grad():
        approx_kl = mean_or_zero((ratio - 1) - log_ratio)
        clip_fraction = mean_or_zero(((ratio - 1).abs() > clip_coef).float())
    total = pg_loss - ent_coef * mean_entropy + vf_coef * v_loss
    return PPOLoss(total, pg_loss, v_loss, mean_entropy, approx_kl, clip_fraction)


def annealed(cfg: PPOConfig, trained_steps: int, total_steps: int) -> float:
    """The fraction of the initial learning rate and clip range to use now."""
    horizon = cfg.anneal_steps or total_steps
    return max(1.0 - trained_steps / horizon, cfg.anneal_floor)


def update(
    model: nn.Module,
    core: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: PPOConfig,
    generator: torch.Generator,
    anneal: float = 1.0,
) -> dict[str, float]:
    """One PPO update on one rank's batch. `model` may be DDP-wrapped (gradients are all-reduced
    in backward, so clipping below sees the global gradient); `core` is the bare module."""
    for group in optimizer.param_groups:
        group["lr"] = cfg.learning_rate * anneal
    steps, slots = batch.rewards.shape
    with torch.no_grad():
        flat_obs = batch.obs.flatten(0, 1)
        old_logp_all, _, values_all = core(flat_obs[: steps * slots], batch.actions.flatten(0, 1))
        bootstrap = core.value(batch.obs[-1]).squeeze(-1)
        values = torch.cat([values_all.view(steps, slots), bootstrap[None]], dim=0)
        old_logp = old_logp_all.view(steps, slots)
        targets = vtrace(
            batch.behaviour_logp, old_logp, batch.rewards, values,
            batch.terminated, batch.truncated, batch.valid,
            gamma=cfg.gamma, lam=cfg.gae_lambda, rho_bar=cfg.rho_bar, c_bar=cfg.c_bar,
        )  # fmt: skip

    keep = batch.valid.flatten()
    obs = batch.obs[:-1].flatten(0, 1)[keep]
    actions = batch.actions.flatten(0, 1)[keep]
    old_logp_flat = old_logp.flatten()[keep]
    advantages = targets.pg_advantages.flatten()[keep]
    vs = targets.vs.flatten()[keep]

    for _epoch in range(cfg.epochs):
        order = torch.randperm(obs.shape[0], generator=generator)
        # The same number of minibatches on every rank, whatever its sample count: DDP needs
        # every rank to run the same number of backward passes.
        for idx in torch.tensor_split(order, cfg.minibatches):
            new_logp, entropy, new_values = model(obs[idx], actions[idx])
            adv = advantages[idx]
            if adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            loss = ppo_loss(
                new_logp, old_logp_flat[idx], adv, new_values, vs[idx], entropy,
                clip_coef=cfg.clip_coef * anneal, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
            )  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.total.backward()
            nn.utils.clip_grad_norm_(core.parameters(), cfg.max_grad_norm, foreach=True)
            optimizer.step()
    stats = {name: float(value.detach()) for name, value in loss._asdict().items()}
    stats["mean_rho"] = float(targets.clipped_rhos.mean())
    return stats
