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
from rlmq.learners.minibatching import pick
from rlmq.learners.networks import ActorCritic, Memory
from rlmq.learners.ppo import Batch, MemberHyperparams, normalize_advantages, ppo_loss


def to_numpy_params(model: nn.Module) -> dict[str, np.ndarray]:
    """`model`'s weights as an actor's NumPy policy takes them (common/models.py)."""
    return {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in model.state_dict().items()}


def _cell_step(cell: nn.Module, x: Tensor, state: Tensor) -> Tensor:
    if isinstance(cell, nn.LSTMCell):
        h, c = cell(x, state.chunk(2, dim=1))
        return torch.cat([h, c], dim=1)
    out: Tensor = cell(x, state)
    return out


def _sequences_of(memory: Memory | None, idx: Tensor | None) -> Memory | None:
    """One member's minibatch of whole sequences (None: all)."""
    if memory is None or idx is None:
        return memory
    return Memory(memory.state[idx], memory.starts[:, idx])


def _in_sequences(
    net: ActorCritic, obs: Tensor, first_state: Tensor, starts: Tensor, length: int, per_sample: Sequence[Tensor]
) -> tuple[Memory, list[Tensor]]:
    """One member's [T · B, ...] tensors as sequences of `length` steps of a slot (chunk c of slot
    b is sequence c · B + b), and their memory: the state entering each chunk, stepped by the
    member's own cell."""
    steps, slots = starts.shape
    chunks = steps // length
    x, state, entering = net.features(obs).view(steps, slots, -1), first_state, []
    with torch.no_grad():
        for t in range(steps):
            if t % length == 0:
                entering.append(state)
            state = _cell_step(net.core, x[t], state * (~starts[t]).unsqueeze(1))

    def cut(y: Tensor) -> Tensor:
        rest = y.shape[1:]
        return y.reshape(chunks, length, slots, *rest).transpose(0, 1).reshape(-1, *rest)

    memory = Memory(torch.cat(entering), cut(starts.reshape(-1)).view(length, chunks * slots))
    return memory, [cut(y) for y in per_sample]


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
        starts = episode_starts(batch.valid[m])
        memory = Memory(batch.core_state[m, 0], starts) if net.recurrent else None
        with torch.no_grad():
            values = net.value(net.trunk(obs_all, memory)).view(rows, slots)
            steps_memory = None if memory is None else Memory(memory.state, starts[:-1])
            old_logp = net(obs_all[: (rows - 1) * slots], actions, steps_memory)[0]
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
        advantages, vs = returns.pg_advantages.reshape(-1), returns.vs.reshape(-1)
        mask = batch.valid[m].reshape(-1).to(torch.float32)
        by_slot = 0
        if steps_memory is not None:  # sequences of whole slots, or of chunks of `bptt_steps`
            steps_memory, (obs, actions, old_logp, advantages, vs, mask) = _in_sequences(
                net,
                obs,
                memory.state,
                starts[:-1],
                cfg.bptt_steps or rows - 1,
                (obs, actions, old_logp, advantages, vs, mask),
            )
            by_slot = steps_memory.state.shape[0]
        old_logp, advantages, vs, mask = (x.unsqueeze(0) for x in (old_logp, advantages, vs, mask))
        for group in optimizer.param_groups:
            group["lr"] = float(hp.learning_rate[m] * anneal[m])
        for idx in plan:
            picked_obs, picked_actions = (pick(x.unsqueeze(0), idx, by_slot)[0] for x in (obs, actions))
            new_logp, entropy, new_values = (
                t.unsqueeze(0) for t in net(picked_obs, picked_actions, _sequences_of(steps_memory, idx))
            )
            loss = ppo_loss(
                new_logp,
                pick(old_logp, idx, by_slot),
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
