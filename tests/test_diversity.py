"""DvD's diversity term (learners/diversity.py): its value and gradient against the kernel
matrix written out entry by entry and the closed form of d(−log det K) = −tr(K⁻¹ dK), and finite
where fastpbrl's NaNs come from: members that act alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlmq.learners import diversity


def reference(e: np.ndarray, length: float, jitter: float) -> tuple[float, np.ndarray]:
    """(−log det(K + δI), its gradient in e), one entry at a time."""
    p = len(e)
    m = e.shape[1]  # the squared distance is per entry
    k = np.array([[math.exp(-((e[i] - e[j]) ** 2).sum() / m / (2 * length**2)) for j in range(p)] for i in range(p)])
    g = -np.linalg.inv(k + jitter * np.eye(p))  # d loss / d K
    grad = np.zeros_like(e)
    for a in range(p):
        for j in range(p):  # K_aj and K_ja both move with e_a
            grad[a] += 2 * g[a, j] * k[a, j] * (e[j] - e[a]) / m / length**2
    return -math.log(np.linalg.det(k + jitter * np.eye(p))), grad


@pytest.mark.parametrize("length", [0.7, 2.0])
def test_the_term_and_its_gradient_equal_the_closed_form(length: float) -> None:
    e = np.random.default_rng(0).normal(size=(4, 6))
    want_loss, want_grad = reference(e, length, diversity.JITTER)
    x = torch.tensor(e, requires_grad=True)
    loss = diversity.diversity_loss(x, length)
    loss.backward()
    assert loss.item() == pytest.approx(want_loss, rel=1e-9)
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=1e-7, atol=1e-10)
    assert torch.autograd.gradcheck(lambda y: diversity.diversity_loss(y, length), (x.detach().requires_grad_(),))


def test_members_that_act_alike_give_a_finite_term_and_no_gradient() -> None:
    """Identical members: fastpbrl's slogdet of a singular K is −inf. Here the term is finite,
    the gradient zero; members that have just begun to part are pushed apart, finitely."""
    same = torch.ones(5, 8, dtype=torch.float32, requires_grad=True)
    loss = diversity.diversity_loss(same)
    loss.backward()
    assert torch.isfinite(loss) and same.grad is not None and torch.equal(same.grad, torch.zeros_like(same))
    assert float(diversity.behavioural_diversity(same)) == 0.0
    near = (torch.ones(5, 8) + 1e-4 * torch.randn(5, 8, generator=torch.Generator().manual_seed(0))).requires_grad_()
    diversity.diversity_loss(near).backward()
    assert near.grad is not None and torch.isfinite(near.grad).all() and near.grad.abs().sum() > 0
    step = near.detach() - 1e-3 * near.grad  # a step down the loss parts them
    assert diversity.behavioural_diversity(step) > diversity.behavioural_diversity(near.detach())


def test_diversity_is_one_far_apart_and_embeds_actions_member_by_member() -> None:
    actions = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2) * 100
    rows = diversity.embed(actions)
    assert rows.shape == (3, 8) and torch.equal(rows[1], actions[1].flatten())
    assert float(diversity.behavioural_diversity(rows)) == pytest.approx(1.0)
