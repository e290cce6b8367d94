"""Recurrent cores for a whole population in one step: each member's LSTM or GRU cell (weights
[P, ...], one row a member, as `nn.LSTMCell`'s and `nn.GRUCell`'s) applied to its own batch by
batched matmuls, the loop over members folded into them (Fast Population-Based RL's layout).

`unroll` runs a core over a rollout's steps from the state it started with, zeroing each slot's
state where an episode starts, as the actors do (common/recurrent.py, the same cells in NumPy):
the learners recompute the core's outputs with the current weights this way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _lstm(from_x: Tensor, state: Tensor, weight_hh_t: Tensor) -> tuple[Tensor, Tensor]:
    """An LSTM step from its input's share of the gates (`from_x` [P, N, 4H], biases included)."""
    hidden = weight_hh_t.shape[1]
    h, c = state[..., :hidden], state[..., hidden:]
    i, f, g, o = (from_x + torch.bmm(h, weight_hh_t)).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, torch.cat([h, c], dim=-1)


def _gru(from_x: Tensor, state: Tensor, weight_hh_t: Tensor, bias_hh: Tensor) -> tuple[Tensor, Tensor]:
    """A GRU step from its input's share of the gates (`from_x` [P, N, 3H], bias_ih included)."""
    from_h = torch.baddbmm(bias_hh.unsqueeze(1), state, weight_hh_t)
    xr, xz, xn = from_x.chunk(3, dim=-1)
    hr, hz, hn = from_h.chunk(3, dim=-1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    h = (1 - z) * n + z * state
    return h, h


def unroll(kind: str, x: Tensor, state: Tensor, starts: Tensor, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The core over T steps: `x` [P, T, N, I] (time-major within each member), `state` [P, N, S]
    at the first step, `starts` [P, T, N] (True where an episode starts at that step: its state
    is zeroed first) → (outputs [P, T, N, H], the state after the last step). The inputs' share of
    every step's gates is one matmul before the loop; each step multiplies the state alone."""
    if kind not in ("lstm", "gru"):
        raise ValueError(f"core {kind!r} is not lstm or gru")
    population, steps, slots, width = x.shape
    bias = weights["bias_ih"] + weights["bias_hh"] if kind == "lstm" else weights["bias_ih"]
    from_x = torch.baddbmm(
        bias.unsqueeze(1), x.reshape(population, steps * slots, width), weights["weight_ih"].transpose(1, 2)
    )
    from_x = from_x.view(population, steps, slots, -1)
    keep = (~starts).unsqueeze(-1).to(state.dtype)
    weight_hh_t = weights["weight_hh"].transpose(1, 2)
    outputs = []
    for t in range(steps):
        state = state * keep[:, t]
        if kind == "lstm":
            h, state = _lstm(from_x[:, t], state, weight_hh_t)
        else:
            h, state = _gru(from_x[:, t], state, weight_hh_t, weights["bias_hh"])
        outputs.append(h)
    return torch.stack(outputs, dim=1), state


def episode_starts(valid: Tensor) -> Tensor:
    """[..., T + 1, B] where each slot's state is zeroed before its step, from a rollout's `valid`
    [..., T, B]: the step after an autoreset step starts an episode (the reset step itself acts on
    the old episode's last observation, its action ignored). Row 0 is False: the state shipped with
    a rollout is taken after the actor's reset (actors/collector.py)."""
    starts = torch.zeros(
        (*valid.shape[:-2], valid.shape[-2] + 1, valid.shape[-1]), dtype=torch.bool, device=valid.device
    )
    starts[..., 1:, :] = ~valid
    return starts


def unroll_cell(cell: nn.LSTMCell | nn.GRUCell, x: Tensor, state: Tensor, starts: Tensor) -> Tensor:
    """One member's core as torch's own cell module runs it (the reference `unroll` is held to, and
    `ActorCritic`'s): `x` [T, N, I], `state` [N, S], `starts` [T, N] → outputs [T, N, H]."""
    hidden, outputs = cell.hidden_size, []
    for t in range(x.shape[0]):
        state = state * (~starts[t]).unsqueeze(-1).to(state.dtype)
        if isinstance(cell, nn.LSTMCell):
            h, c = cell(x[t], (state[:, :hidden], state[:, hidden:]))
            state = torch.cat([h, c], dim=-1)
        else:
            h = state = cell(x[t], state)
        outputs.append(h)
    return torch.stack(outputs)
