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
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> VTraceReturns:
    """V-trace (Espeholt et al. 2018, eq. 1), with the λ of its remark 2 folded into c."""
    with torch.no_grad():
        rhos = torch.exp(target_logp - behaviour_logp)
        clipped_rhos = torch.clamp(rhos, max=rho_bar)
        cs = lam * torch.clamp(rhos, max=c_bar)
        keep = valid.to(values.dtype)
        discounts = gamma * (1.0 - terminated.to(values.dtype))
        continues = 1.0 - (terminated | truncated).to(values.dtype)
        deltas = keep * clipped_rhos * (rewards + discounts * values[1:] - values[:-1])

        corrections = torch.zeros_like(values)  # vs - V, one row longer: the last stays 0
        for t in range(rewards.shape[0] - 1, -1, -1):
            corrections[t] = keep[t] * (
                deltas[t] + gamma * cs[t] * continues[t] * corrections[t + 1]
            )
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
    gamma: float,
    lam: float,
) -> GAEReturns:
    """Generalized advantage estimation (Schulman et al. 2016) for on-policy data."""
    with torch.no_grad():
        keep = valid.to(values.dtype)
        discounts = gamma * (1.0 - terminated.to(values.dtype))
        continues = 1.0 - (terminated | truncated).to(values.dtype)
        deltas = keep * (rewards + discounts * values[1:] - values[:-1])
        advantages = torch.zeros_like(values)
        for t in range(rewards.shape[0] - 1, -1, -1):
            advantages[t] = keep[t] * (deltas[t] + gamma * lam * continues[t] * advantages[t + 1])
        advantages = advantages[:-1]
    return GAEReturns(advantages=advantages, returns=advantages + values[:-1])
