"""Advantage and value-target estimators as pure functions of time-major tensors.

Shapes: T steps × B slots; `values` has T + 1 rows, the last being the bootstrap value. Every
function honours three masks the actor records:

- ``terminated``: the episode ended for real, so the next state's value is 0;
- ``truncated``: it was cut by a time limit, so the next state (the final observation) is
  bootstrapped, but the trace does not run on into the next episode;
- ``valid``: False for the step a next-step autoreset spends resetting a slot; such a step carries
  no learning signal and cuts nothing (the step before it is already done).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class VTraceReturns(NamedTuple):
    vs: Tensor  # [T, B] value targets
    pg_advantages: Tensor  # [T, B] policy-gradient advantages, clipped-ratio weighted
    clipped_rhos: Tensor  # [T, B]


class GAEReturns(NamedTuple):
    advantages: Tensor  # [T, B]
    returns: Tensor  # [T, B] advantages + values


def vtrace(
    behaviour_logp: Tensor,
    target_logp: Tensor,
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    valid: Tensor,
    *,
    gamma: float | Tensor,
    lam: float | Tensor = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTraceReturns:
    """V-trace (Espeholt et al. 2018, eq. 1), with the λ of its remark 2 folded into c. `gamma` and
    `lam` may be [B] tensors: one per slot (members of a population differ)."""
    with torch.no_grad():
        rhos = torch.exp(target_logp - behaviour_logp)
        clipped_rhos = torch.clamp(rhos, max=rho_bar)
        cs = lam * torch.clamp(rhos, max=c_bar)
        keep, discounts, continues = _masks(terminated, truncated, valid, gamma, values.dtype)
        deltas = keep * clipped_rhos * (rewards + discounts * values[1:] - values[:-1])
        corrections = _backward_sum(deltas, gamma * cs * continues, keep)  # vs - V, T + 1 rows
        vs = values[:-1] + corrections[:-1]
        next_vs = values[1:] + continues * corrections[1:]
        pg_advantages = keep * clipped_rhos * (rewards + discounts * next_vs - values[:-1])
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages, clipped_rhos=clipped_rhos)


def gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    valid: Tensor,
    *,
    gamma: float | Tensor,
    lam: float | Tensor,
) -> GAEReturns:
    """Generalized advantage estimation (Schulman et al. 2016) for on-policy data."""
    with torch.no_grad():
        keep, discounts, continues = _masks(terminated, truncated, valid, gamma, values.dtype)
        deltas = keep * (rewards + discounts * values[1:] - values[:-1])
        advantages = _backward_sum(deltas, gamma * lam * continues, keep)[:-1]
    return GAEReturns(advantages=advantages, returns=advantages + values[:-1])


def _masks(
    terminated: Tensor, truncated: Tensor, valid: Tensor, gamma: float | Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """(keep: a real step; discounts: γ unless terminated; continues: 1 unless the episode ended)."""
    keep = valid.to(dtype)
    discounts = gamma * (1.0 - terminated.to(dtype))
    continues = 1.0 - (terminated | truncated).to(dtype)
    return keep, discounts, continues


def _backward_sum(deltas: Tensor, decay: Tensor, keep: Tensor) -> Tensor:
    """acc[t] = keep[t] · (deltas[t] + decay[t] · acc[t + 1]), with acc[T] = 0; T + 1 rows."""
    gain, start = keep * decay, keep * deltas  # acc[t] = start[t] + gain[t] · acc[t + 1]
    acc = torch.zeros((deltas.shape[0] + 1, *deltas.shape[1:]), dtype=deltas.dtype, device=deltas.device)
    if acc.device.type == "cpu":  # a NumPy call on a row costs a fraction of a torch op's
        acc_np, gain_np, start_np = acc.numpy(), gain.numpy(), start.numpy()
        for t in range(deltas.shape[0] - 1, -1, -1):
            np.multiply(gain_np[t], acc_np[t + 1], out=acc_np[t])
            acc_np[t] += start_np[t]
        return acc
    for t in range(deltas.shape[0] - 1, -1, -1):
        torch.addcmul(start[t], gain[t], acc[t + 1], out=acc[t])
    return acc
