"""References the tests and benchmarks hold production code to: a torch module's weights as the
actors read them, and PPO's update as a plain loop over members."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.algorithms import PPOConfig
from rlmq.learners.advantages import vtrace
from rlmq.learners.cores import episode_starts
from rlmq.learners.networks import ActorCritic, Memory
from rlmq.learners.ppo import Batch, MemberHyperparams, normalize_advantages, pick, ppo_loss


def to_numpy_params(model: nn.Module) -> dict[str, np.ndarray]:
    """`model`'s weights as an actor's NumPy policy takes them (common/models.py)."""
    return {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in model.state_dict().items()}


def _slots_of(memory: Memory | None, idx: Tensor | None) -> Memory | None:
    """One member's minibatch of whole slots (None: all), over the rows that have actions."""
    if memory is None:
        return None
    starts = memory.starts[:-1]
    return memory._replace(starts=starts) if idx is None else Memory(memory.state[idx], starts[:, idx])


def update_each_member(
    nets: Sequence[ActorCritic],
    optimizers: Sequence[torch.optim.Optimizer],
    batch: Batch,
    hp: MemberHyperparams,
    cfg: PPOConfig,
    plan: Sequence[Tensor | None],
    anneal: Tensor,
    norm: Tensor,
    active: Tensor,
) -> None:
    """The reference `update` is tested against: a Python loop over members, each an ordinary
    `ActorCritic` with its own `torch.optim.Adam` (lr set per member) and `clip_grad_norm_`. A
    recurrent member runs its own `nn.LSTMCell` or `nn.GRUCell` over each slot's steps, and its
    plan names slots."""
    for m, (net, optimizer) in enumerate(zip(nets, optimizers, strict=True)):
        if not active[m]:
            continue
        one = slice(m, m + 1)
        rows, slots = batch.obs.shape[1:3]
        obs_all = batch.obs[m].reshape(rows * slots, -1)
        actions = batch.actions[m].reshape((rows - 1) * slots, *batch.actions.shape[3:])
        memory = Memory(batch.core_state[m, 0], episode_starts(batch.valid[m])) if net.recurrent else None
        by_slot = slots if net.recurrent else 0

        with torch.no_grad():
            values = net.value(net.trunk(obs_all, memory)).view(rows, slots)
            old_logp = net(obs_all[: (rows - 1) * slots], actions, _slots_of(memory, None))[0]
            returns = vtrace(
                batch.behaviour_logp[m],
                old_logp.view(rows - 1, slots),
                batch.rewards[m],
                values,
                batch.terminated[m],
                batch.truncated[m],
                batch.valid[m],
                gamma=float(hp.gamma[m]),
                lam=float(hp.gae_lambda[m]),
                rho_bar=cfg.rho_bar,
                c_bar=cfg.c_bar,
            )
        obs = obs_all[: (rows - 1) * slots]
        advantages, vs = returns.pg_advantages.reshape(1, -1), returns.vs.reshape(1, -1)
        mask = batch.valid[m].reshape(1, -1).to(torch.float32)
        for group in optimizer.param_groups:
            group["lr"] = float(hp.learning_rate[m] * anneal[m])
        for idx in plan:
            picked_obs, picked_actions = (pick(x.unsqueeze(0), idx, by_slot)[0] for x in (obs, actions))
            new_logp, entropy, new_values = (
                t.unsqueeze(0) for t in net(picked_obs, picked_actions, _slots_of(memory, idx))
            )
            loss = ppo_loss(
                new_logp,
                pick(old_logp.unsqueeze(0), idx, by_slot),
                normalize_advantages(pick(advantages, idx, by_slot), pick(mask, idx, by_slot), cfg.normalize_advantage),
                new_values,
                pick(vs, idx, by_slot),
                entropy,
                pick(mask, idx, by_slot),
                norm[one],
                clip_coef=hp.clip_coef[one] * anneal[one],
                ent_coef=hp.ent_coef[one],
                vf_coef=hp.vf_coef[one],
            )
            optimizer.zero_grad(set_to_none=True)
            loss.total.sum().backward()
            nn.utils.clip_grad_norm_(net.parameters(), float(hp.max_grad_norm[m]))
            optimizer.step()
