"""PPO's loss from the logits, with its hand-written gradient, against `ppo.ppo_loss` through autograd."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rlmq.learners import ppo
from rlmq.learners.ppo_logits import ppo_loss_from_logits

P, A, N = 3, 4, 50


def inputs(old_from_logits: bool) -> dict[str, Tensor]:
    """Random float64 inputs. Old log-probabilities far from the new ones put many samples outside
    the clip range on both sides; `old_from_logits` makes every ratio exactly 1 (a first epoch)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(P, A, N, generator=g, dtype=torch.float64)
    actions = torch.randint(0, A, (P, N), generator=g)
    logp = torch.log_softmax(logits, 1).gather(1, actions.unsqueeze(1)).squeeze(1)
    old = logp.clone() if old_from_logits else logp + 0.5 * torch.randn(P, N, generator=g, dtype=torch.float64)
    mask = (torch.rand(P, N, generator=g) < 0.8).to(torch.float64)
    return {
        "logits": logits,
        "values": torch.randn(P, N, generator=g, dtype=torch.float64),
        "actions": actions,
        "old_logp": old,
        "advantages": torch.randn(P, N, generator=g, dtype=torch.float64),
        "value_targets": torch.randn(P, N, generator=g, dtype=torch.float64),
        "mask": mask,
        "norm": mask.sum(-1) + torch.tensor([0.0, 3.0, 10.0], dtype=torch.float64),
        "clip_coef": torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
        "ent_coef": torch.tensor([0.0, 0.01, 0.5], dtype=torch.float64),
        "vf_coef": torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64),
    }


def reference(x: dict[str, Tensor], logits: Tensor, values: Tensor) -> tuple[ppo.PPOLoss, Tensor]:
    """The autograd path: the head as `PopulationActorCritic.policy` runs it, then `ppo_loss`."""
    log_probs = torch.log_softmax(logits, 1)
    logp = log_probs.gather(1, x["actions"].unsqueeze(1)).squeeze(1)
    entropy = -(log_probs.exp() * log_probs).sum(1)
    loss = ppo.ppo_loss(
        logp,
        x["old_logp"],
        x["advantages"],
        values,
        x["value_targets"],
        entropy,
        x["mask"],
        x["norm"],
        clip_coef=x["clip_coef"],
        ent_coef=x["ent_coef"],
        vf_coef=x["vf_coef"],
    )
    return loss, logp


@pytest.mark.parametrize("first_epoch", [False, True], ids=["ratios-spread", "ratios-exactly-1"])
def test_loss_and_gradient_match_ppo_loss_through_autograd(first_epoch: bool) -> None:
    x = inputs(first_epoch)
    ours_in = [x["logits"].clone().requires_grad_(), x["values"].clone().requires_grad_()]
    want_in = [x["logits"].clone().requires_grad_(), x["values"].clone().requires_grad_()]
    *ours, logp = ppo_loss_from_logits(
        *ours_in,
        x["actions"],
        x["old_logp"],
        x["advantages"],
        x["value_targets"],
        x["mask"],
        x["norm"],
        clip_coef=x["clip_coef"],
        ent_coef=x["ent_coef"],
        vf_coef=x["vf_coef"],
    )
    want, want_logp = reference(x, *want_in)
    for name, got, expected in zip(ppo.PPOLoss._fields, ours, want, strict=True):
        torch.testing.assert_close(got, expected, msg=lambda m, name=name: f"{name}: {m}")
    torch.testing.assert_close(logp, want_logp)
    ratio = (want_logp - x["old_logp"]).exp()
    clipped = (ratio < 1 - x["clip_coef"][:, None]) | (ratio > 1 + x["clip_coef"][:, None])
    assert first_epoch or 0.2 < float(clipped.double().mean()) < 0.8, "the inputs must exercise both branches"
    # Every output takes part in the backward (the learner only uses `total`; DDP may see more).
    upstream = [torch.randn(P, generator=torch.Generator().manual_seed(k), dtype=torch.float64) for k in range(4)]
    got_grads = torch.autograd.grad(sum((u * o).sum() for u, o in zip(upstream, ours, strict=True)), ours_in)
    want_grads = torch.autograd.grad(sum((u * o).sum() for u, o in zip(upstream, want, strict=True)), want_in)
    for name, got, expected in zip(("logits", "values"), got_grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, msg=lambda m, name=name: f"∂/∂{name}: {m}")


def test_gradcheck() -> None:
    x = inputs(False)
    rest = [x[k] for k in ("actions", "old_logp", "advantages", "value_targets", "mask", "norm")]
    coefs = {k: x[k] for k in ("clip_coef", "ent_coef", "vf_coef")}
    logits, values = x["logits"].requires_grad_(), x["values"].requires_grad_()
    assert torch.autograd.gradcheck(lambda z, v: ppo_loss_from_logits(z, v, *rest, **coefs)[:4], (logits, values))


def test_a_second_derivative_is_refused_not_dropped() -> None:
    x = inputs(False)
    rest = [x[k] for k in ("actions", "old_logp", "advantages", "value_targets", "mask", "norm")]
    coefs = {k: x[k] for k in ("clip_coef", "ent_coef", "vf_coef")}
    logits, values = x["logits"].requires_grad_(), x["values"].requires_grad_()
    total = ppo_loss_from_logits(logits, values, *rest, **coefs)[0]
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(total.sum(), logits, create_graph=True)
