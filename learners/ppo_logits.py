"""PPO's loss for discrete actions taken straight from the policy's logits, with its gradient
written by hand: the learners' fast path for `ppo.ppo_loss`.

Through autograd, the head (log-softmax, the taken action's log-probability, the entropy) and the
loss (ratio, clipping, masked sums) are some forty small ops forward and as many backward. On one
CPU thread they cost more than the matmuls of a 64×64 network (benchmarks/LOG.md §4). Here they
are one node. `ppo.ppo_loss` stays the reference: `tests/test_ppo_logits.py`
holds the two equal, value and gradient, in float64.

Gradients, per sample, with w = mask / norm of its member:
  ∂pg/∂logp      = −A·ratio·w where the unclipped term is the one taken (or the ratio is inside
                   the clip range), else 0
  ∂v_loss/∂value = (value − target)·w
  ∂H/∂entropy    = w
  ∂logp/∂z       = onehot(action) − p
  ∂entropy/∂z    = −p·(log p + entropy)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from rlmq.learners.stacked_mlp import refuse_second_derivative, traced


def ppo_loss_from_logits(
    logits: Tensor,
    values: Tensor,
    actions: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    value_targets: Tensor,
    mask: Tensor,
    norm: Tensor,
    *,
    clip_coef: Tensor,
    ent_coef: Tensor,
    vf_coef: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(total, pg_loss, v_loss, entropy), each [P], as `ppo.ppo_loss` gives them, and the taken
    actions' log-probabilities [P, n] (no gradient; for the diagnostics). `logits` [P, A, n]
    (`outputs_first`), `values` [P, n], `actions` [P, n] int64; the rest as `ppo.ppo_loss`.
    While torch.compile traces it, the same forward in autograd ops: the compiler derives and fuses
    the backward itself."""
    if traced():
        terms = _forward(
            logits, values, actions, old_logp, advantages, value_targets, mask, norm, clip_coef, ent_coef, vf_coef
        )
        return terms.total, terms.pg_loss, terms.v_loss, terms.mean_entropy, terms.logp.detach()
    out: tuple[Tensor, Tensor, Tensor, Tensor, Tensor] = _PPOLossFromLogits.apply(
        logits, values, actions, old_logp, advantages, value_targets, mask, norm, clip_coef, ent_coef, vf_coef
    )
    return out


class _Terms(NamedTuple):
    """The loss's terms, and what its backward reuses."""

    total: Tensor
    pg_loss: Tensor
    v_loss: Tensor
    mean_entropy: Tensor
    logp: Tensor
    saved: tuple[Tensor, ...]


def _forward(
    logits: Tensor,
    values: Tensor,
    actions: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    value_targets: Tensor,
    mask: Tensor,
    norm: Tensor,
    clip_coef: Tensor,
    ent_coef: Tensor,
    vf_coef: Tensor,
) -> _Terms:
    log_probs = torch.log_softmax(logits, dim=1)  # [P, A, n]
    probs = log_probs.exp()
    index = actions.unsqueeze(1)
    logp = log_probs.gather(1, index).squeeze(1)  # [P, n]
    entropy = -(probs * log_probs).sum(1)
    weight = mask / norm.unsqueeze(-1)  # each sample's share of its member's sums
    ratio = (logp - old_logp).exp()
    clip = clip_coef.unsqueeze(-1)
    unclipped, clipped = advantages * ratio, advantages * ratio.clamp(1 - clip, 1 + clip)
    pg_loss = -(torch.minimum(unclipped, clipped) * weight).sum(-1)
    error = values - value_targets
    v_loss = 0.5 * (error * error * weight).sum(-1)
    mean_entropy = (entropy * weight).sum(-1)
    total = pg_loss - ent_coef * mean_entropy + vf_coef * v_loss
    # Where the clipped term is taken and the ratio is outside the range, PPO's gradient is 0.
    moves = (unclipped <= clipped) | ((ratio > 1 - clip) & (ratio < 1 + clip))
    saved = (log_probs, probs, entropy, index, weight, ratio, advantages, moves, error, ent_coef, vf_coef)
    return _Terms(total, pg_loss, v_loss, mean_entropy, logp, saved)


class _PPOLossFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        values: Tensor,
        actions: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        value_targets: Tensor,
        mask: Tensor,
        norm: Tensor,
        clip_coef: Tensor,
        ent_coef: Tensor,
        vf_coef: Tensor,
    ) -> tuple[Tensor, ...]:
        terms = _forward(
            logits, values, actions, old_logp, advantages, value_targets, mask, norm, clip_coef, ent_coef, vf_coef
        )
        ctx.save_for_backward(*terms.saved)
        ctx.mark_non_differentiable(terms.logp)
        return terms.total, terms.pg_loss, terms.v_loss, terms.mean_entropy, terms.logp

    @staticmethod
    def backward(
        ctx: Any, g_total: Tensor, g_pg: Tensor, g_v: Tensor, g_entropy: Tensor, _g_logp: Tensor
    ) -> tuple[Tensor | None, ...]:
        refuse_second_derivative("ppo_loss_from_logits")
        log_probs, probs, entropy, index, weight, ratio, advantages, moves, error, ent_coef, vf_coef = ctx.saved_tensors
        pg_scale = (g_total + g_pg).unsqueeze(-1)  # [P, 1]: how much each member's sums count
        v_scale = (g_total * vf_coef + g_v).unsqueeze(-1)
        entropy_scale = (g_entropy - g_total * ent_coef).unsqueeze(-1)
        g_logp = -pg_scale * advantages * ratio * weight * moves  # [P, n]
        g_per_entropy = (entropy_scale * weight).unsqueeze(1)  # [P, 1, n]
        # ∂/∂z = g_logp·(onehot − p) − g_H·p·(log p + H) = −p·(g_logp + g_H·(log p + H)) + g_logp·onehot
        g_logits = -probs * torch.addcmul(g_logp.unsqueeze(1), g_per_entropy, log_probs + entropy.unsqueeze(1))
        g_logits.scatter_add_(1, index, g_logp.unsqueeze(1))
        g_values = v_scale * error * weight
        return (g_logits, g_values, *([None] * 9))
