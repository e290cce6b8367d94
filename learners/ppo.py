"""Asynchronous PPO with V-trace targets for a whole population: the loss as a pure function, one
vectorized update for every member at once, and the loop over members it is tested against.

Data arrive from actors that acted with an older policy μ. Following decoupled PPO (Hilton et al.
2021), the *proximal* policy is the learner's policy at the start of the update, π_old: V-trace
corrects μ → π_old (clipped importance weights, in the advantages and value targets), and PPO's
clip keeps the epochs near π_old. With fresh data (μ = π_old) this is plain PPO.

Shapes: P members, each with T steps of B slots; per-sample tensors in the update are [P, n] with
n = T·B (time-major) and a validity mask. A recurrent network's minibatches are whole slots, each
slot's T steps unrolled through the core from the state its rollout started with (`Memory`). A
member with no data this update has an all-False mask; it is *inactive*, and the optimizer leaves
it untouched. A single agent is a population of one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.schema import EnvSpec, allocate, side_by_side
from rlmq.common.wire import Rollout
from rlmq.learners.advantages import vtrace
from rlmq.learners.capture import captured, compiled, with_gradient
from rlmq.learners.cores import episode_starts
from rlmq.learners.minibatching import in_sequences, minibatch_memory, pick
from rlmq.learners.networks import Memory, PopulationActorCritic, obs_features
from rlmq.learners.optim import (
    PopulationAdam,
    Step,
    Sync,
    clip_and_step,
    clip_then_step,
    written_by_step,
)
from rlmq.learners.ppo_logits import ppo_loss_from_logits

TUNABLE = ALGORITHMS["ppo"].tunable


class Batch(NamedTuple):
    """Every member's rollouts, joined along the slot axis: [P, T(+1), B, ...] tensors."""

    obs: Tensor
    actions: Tensor
    behaviour_logp: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    valid: Tensor
    core_state: Tensor  # [P, 1, B, S]: each slot's core state at the first step (S = 0: no core)

    def memory(self) -> Memory:
        """What a recurrent network unrolls the batch's T + 1 rows from."""
        return Memory(self.core_state[:, 0], episode_starts(self.valid))


class MemberHyperparams(NamedTuple):
    """Per-member hyperparameters as [P] tensors (PBT sets them: PPO's tunables, algorithms.ALGORITHMS)."""

    learning_rate: Tensor
    ent_coef: Tensor
    clip_coef: Tensor
    vf_coef: Tensor
    gamma: Tensor
    gae_lambda: Tensor
    max_grad_norm: Tensor


assert MemberHyperparams._fields == TUNABLE, "MemberHyperparams must list exactly PPO's tunables"


class PPOLoss(NamedTuple):
    """Per-member terms, each [P]."""

    total: Tensor
    pg_loss: Tensor
    v_loss: Tensor
    entropy: Tensor


def _field(name: str, _member: int, rollout: Rollout) -> Any:
    return getattr(rollout, name)


def _first_state(_member: int, rollout: Rollout) -> np.ndarray:
    assert rollout.core_state is not None  # the learner checked it (schema.core_state_problem)
    return rollout.core_state[None]


def join_rollouts(
    per_member: Sequence[Sequence[Rollout]],
    spec: EnvSpec,
    steps: int,
    slots: int,
    device: torch.device,
    state_size: int = 0,
) -> Batch:
    """Member m's rollouts side by side in row m; members with fewer fill the rest as invalid (and
    their core states with zeros)."""
    arrays = allocate(spec, steps, slots, lead=(len(per_member),), zeros=True)
    t = {
        name: torch.from_numpy(side_by_side(per_member, array, functools.partial(_field, name))).to(device)
        for name, array in arrays.items()
    }
    state = np.zeros((len(per_member), 1, slots, state_size), np.float32)
    if state_size:
        side_by_side(per_member, state, _first_state)
    return Batch(
        obs_features(t["obs"], spec),
        t["actions"],
        t["logprobs"],
        t["rewards"],
        t["terminated"],
        t["truncated"],
        t["valid"],
        torch.from_numpy(state).to(device),
    )


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1)


def normalize_advantages(adv: Tensor, mask: Tensor, enabled: bool = True) -> Tensor:
    """Per member, over its valid samples (unbiased std, as torch.std); left alone below 2, or
    when the run does not normalize advantages (`enabled` False)."""
    if not enabled:
        return adv
    count = mask.sum(-1, keepdim=True)
    mean = masked_sum(adv, mask).unsqueeze(-1) / count.clamp(min=1)
    var = masked_sum((adv - mean) ** 2, mask).unsqueeze(-1) / (count - 1).clamp(min=1)
    return torch.where(count > 1, (adv - mean) / (var.sqrt() + 1e-8), adv)


def ppo_loss(
    new_logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    new_values: Tensor,
    value_targets: Tensor,
    entropy: Tensor,
    mask: Tensor,
    norm: Tensor,
    *,
    clip_coef: Tensor,
    ent_coef: Tensor,
    vf_coef: Tensor,
) -> PPOLoss:
    """Per-sample tensors [P, n]; `mask` [P, n]; `norm` and the coefficients [P]. Each member's
    sums are divided by its `norm` (see `loss_normalizers`), not by its local sample count."""
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    clip = clip_coef.unsqueeze(-1)
    clipped = ratio.clamp(1 - clip, 1 + clip)
    pg_loss = masked_sum(torch.max(-advantages * ratio, -advantages * clipped), mask) / norm
    v_loss = 0.5 * masked_sum((new_values - value_targets) ** 2, mask) / norm
    mean_entropy = masked_sum(entropy, mask) / norm
    total = pg_loss - ent_coef * mean_entropy + vf_coef * v_loss
    return PPOLoss(total, pg_loss, v_loss, mean_entropy)


@torch.no_grad()
def diagnostics(new_logp: Tensor, old_logp: Tensor, mask: Tensor, clip_coef: Tensor) -> dict[str, Tensor]:
    """How far the update moved the policy, per member [P]: approximate KL and clipped fraction.
    Computed once, on the last minibatch: the epochs before it need only the loss."""
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    count = mask.sum(-1).clamp(min=1)
    return {
        "approx_kl": masked_sum((ratio - 1) - log_ratio, mask) / count,
        "clip_fraction": masked_sum(((ratio - 1).abs() > clip_coef.unsqueeze(-1)).float(), mask) / count,
    }


def loss_normalizers(global_counts: Tensor, minibatches: int, world_size: int) -> Tensor:
    """What each member's loss sums are divided by, so that after DDP averages the ranks' gradients
    each member's gradient is that of its mean loss over all ranks' samples in a minibatch
    (≈ count / minibatches of them), however unevenly the ranks hold its data."""
    return global_counts.clamp(min=1).to(torch.float32) / (minibatches * world_size)


def annealed(cfg: PPOConfig, trained_steps: int, horizon_steps: int) -> float:
    """The fraction of the initial learning rate and clip range to use now."""
    horizon = cfg.anneal_steps or horizon_steps
    return max(1.0 - trained_steps / horizon, cfg.anneal_floor)


def _targets(
    core: PopulationActorCritic,
    batch: Batch,
    hp: MemberHyperparams,
    cfg: PPOConfig,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """π_old's log-probabilities, V-trace advantages and value targets, each [P, n], and the mean
    clipped importance weight over the valid steps."""
    population, rows, slots = batch.obs.shape[:3]
    steps = rows - 1
    with torch.no_grad():
        # Rows are time-major, so the first steps · slots are the steps that have actions.
        old_logp, values = core.logp_and_values(
            batch.obs.reshape(population, rows * slots, -1),
            batch.actions.reshape(population, steps * slots, *batch.actions.shape[3:]),
            batch.memory() if core.recurrent else None,
        )
        values = values.view(population, rows, slots)

        def time_major(x: Tensor) -> Tensor:  # [P, T, B] → [T, P·B], as vtrace takes it
            return x.transpose(0, 1).reshape(x.shape[1], population * slots)

        returns = vtrace(
            time_major(batch.behaviour_logp),
            time_major(old_logp.view(population, steps, slots)),
            time_major(batch.rewards),
            time_major(values),
            time_major(batch.terminated),
            time_major(batch.truncated),
            time_major(batch.valid),
            gamma=hp.gamma.repeat_interleave(slots),
            lam=hp.gae_lambda.repeat_interleave(slots),
            rho_bar=cfg.rho_bar,
            c_bar=cfg.c_bar,
        )

    def member_major(x: Tensor) -> Tensor:  # [T, P·B] → [P, n]
        return x.view(steps, population, slots).transpose(0, 1).reshape(population, steps * slots)

    valid = time_major(batch.valid).to(returns.clipped_rhos.dtype)  # padding and autoreset steps: not data
    mean_rho = (returns.clipped_rhos * valid).sum() / valid.sum().clamp(min=1)
    return old_logp, member_major(returns.pg_advantages), member_major(returns.vs), mean_rho


def minibatch_loss(
    model: nn.Module,
    discrete: bool,
    obs: Tensor,
    actions: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    value_targets: Tensor,
    mask: Tensor,
    norm: Tensor,
    clip: Tensor,
    ent_coef: Tensor,
    vf_coef: Tensor,
    normalize: bool,
    memory: Memory | None = None,
) -> tuple[PPOLoss, Tensor]:
    """A minibatch's loss terms [P] and the new log-probabilities [P, n] (for the diagnostics):
    `advantages` normalized here if `normalize`; `model` as `update` says; a recurrent one unrolls
    from `memory`."""
    advantages = normalize_advantages(advantages, mask, normalize)
    if discrete:  # the same loss, one autograd node from the logits (ppo_logits.py)
        logits, new_values = model(obs, None, memory)
        total, pg_loss, v_loss, mean_entropy, new_logp = ppo_loss_from_logits(
            logits,
            new_values,
            actions,
            old_logp,
            advantages,
            value_targets,
            mask,
            norm,
            clip_coef=clip,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
        )
        return PPOLoss(total, pg_loss, v_loss, mean_entropy), new_logp
    new_logp, entropy, new_values = model(obs, actions, memory)
    loss = ppo_loss(
        new_logp,
        old_logp,
        advantages,
        new_values,
        value_targets,
        entropy,
        mask,
        norm,
        clip_coef=clip,
        ent_coef=ent_coef,
        vf_coef=vf_coef,
    )
    return loss, new_logp


class CapturedSteps(NamedTuple):
    """PPO's update as learners/capture.py captures it, for `update`."""

    targets: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]  # `_targets`, once per update
    gradient: Callable[..., tuple[PPOLoss, Tensor]]  # `minibatch_loss` compiled, then its gradient
    sync: Sync  # averages the gradient across the ranks, eagerly
    step: Step  # `optim.clip_and_step`, compiled


def capture(mode: str, sync: Sync, backend: str = "") -> CapturedSteps:
    """PPO's update in `mode` (learners/capture.py), for `update`: a minibatch's loss and its
    gradient on the module's `flat` parameters, then the step."""
    loss = compiled(minibatch_loss, mode, backend)

    def loss_and_gradient(core: PopulationActorCritic, *args: Any) -> tuple[PPOLoss, Tensor]:
        out: tuple[PPOLoss, Tensor] = with_gradient(loss, lambda out: out[0].total.sum(), core.flat)(core, *args)
        return out

    return CapturedSteps(
        captured(_targets, mode),
        captured(loss_and_gradient, mode),
        sync,
        captured(compiled(clip_and_step, mode, backend), mode, written_by_step),
    )


def update(
    model: nn.Module,
    core: PopulationActorCritic,
    optimizer: PopulationAdam,
    batch: Batch,
    hp: MemberHyperparams,
    cfg: PPOConfig,
    plan: Sequence[Tensor | None],
    anneal: Tensor,
    norm: Tensor,
    active: Tensor,
    captured: CapturedSteps | None = None,
) -> dict[str, float]:
    """One PPO update of every member on one rank's batch, vectorized over the members.

    `model` may be DDP-wrapped (gradients are all-reduced in backward, so the per-member clipping
    below sees the global gradient); `core` is the bare module. `anneal` [P] scales each member's
    learning rate and clip range; `norm` [P] is from `loss_normalizers`; `active` [P] says which
    members have data on some rank. With `captured`, each gradient step runs its compiled loss
    and step on `core` (`model` unused), and its `sync` all-reduces between them.
    """
    population, rows, slots = batch.obs.shape[:3]
    old_logp, advantages, vs, mean_rho = (_targets if captured is None else captured.targets)(core, batch, hp, cfg)
    obs = batch.obs[:, :-1].reshape(population, (rows - 1) * slots, -1)
    actions = batch.actions.reshape(population, (rows - 1) * slots, *batch.actions.shape[3:])
    mask = batch.valid.reshape(population, -1).to(torch.float32)
    lr, clip = hp.learning_rate * anneal, hp.clip_coef * anneal
    normalize = cfg.normalize_advantage
    # A recurrent network's plan names whole sequences of steps (`in_sequences`), unrolled from `memory`.
    memory, by_slot = None, 0
    if core.recurrent:
        memory, (obs, actions, old_logp, advantages, vs, mask) = in_sequences(
            core, batch.memory(), obs, cfg.bptt_steps, (obs, actions, old_logp, advantages, vs, mask)
        )
        by_slot = memory.state.shape[1]
    if captured is None and None in plan:  # the epochs over the whole batch normalize its advantages once
        whole_batch_advantages = normalize_advantages(advantages, mask, normalize)
    for idx in plan:
        if captured is None:
            whole = idx is None
            loss, new_logp = minibatch_loss(
                model,
                core.discrete,
                pick(obs, idx, by_slot),
                pick(actions, idx, by_slot),
                pick(old_logp, idx, by_slot),
                whole_batch_advantages if whole else pick(advantages, idx, by_slot),
                pick(vs, idx, by_slot),
                pick(mask, idx, by_slot),
                norm,
                clip,
                hp.ent_coef,
                hp.vf_coef,
                normalize and not whole,
                minibatch_memory(memory, idx),
            )
            optimizer.zero_grad()
            loss.total.sum().backward()  # under DDP, all-reduced in backward
            clip_then_step(optimizer, hp.max_grad_norm, lr, active)
            continue
        loss, new_logp = captured.gradient(
            core,
            core.discrete,
            pick(obs, idx),
            pick(actions, idx),
            pick(old_logp, idx),
            pick(advantages, idx),
            pick(vs, idx),
            pick(mask, idx),
            norm,
            clip,
            hp.ent_coef,
            hp.vf_coef,
            normalize,
        )
        assert core.flat.grad is not None
        captured.sync(core.flat.grad)
        captured.step(optimizer, hp.max_grad_norm, lr, active)
    terms = {**loss._asdict(), **diagnostics(new_logp, pick(old_logp, idx, by_slot), pick(mask, idx, by_slot), clip)}
    weight = active.to(torch.float32) / active.sum().clamp(min=1)
    stats = {name: float((value.detach() * weight).sum()) for name, value in terms.items()}
    stats["mean_rho"] = float(mean_rho)
    return stats
