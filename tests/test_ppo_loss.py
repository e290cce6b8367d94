"""PPO's objective against numbers worked out by hand (Schulman et al. 2017, eq. 7 and 9): the
clipped surrogate takes the pessimistic side for either sign of the advantage, masked samples count
for nothing, and each member's sums are divided by its own normalizer. The population update, the
hand-written logits backward and the captured update are all tested against `ppo_loss`; this file
is what `ppo_loss` itself answers to."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlmq.learners.ppo import loss_normalizers, normalize_advantages, ppo_loss

F64 = torch.float64


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


# Two members, three samples each. old log-probabilities are 0, so each ratio is exp(new_logp).
RATIOS = [[1.5, 0.5, 3.0], [1.05, 0.7, 1.5]]
ADVANTAGES = t([[2.0, -1.0, 10.0], [1.0, 1.0, -2.0]])
MASK = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # member 0's third sample is padding
NORM = torch.tensor([4.0, 3.0], dtype=F64)  # member 0's differs from its sample count on purpose
VALUES, TARGETS = t([[1.0, 2.0, 100.0], [0.0, 0.0, 0.0]]), t([[0.0, 4.0, 0.0], [1.0, 2.0, 3.0]])
ENTROPY = t([[0.7, 0.3, 9.0], [1.0, 1.0, 1.0]])
CLIP, ENT, VF = (torch.tensor(v, dtype=F64) for v in ([0.2, 0.1], [0.01, 0.0], [0.5, 1.0]))

# By hand, per sample: max(−A·r, −A·clip(r, 1 − ε, 1 + ε)).
#   member 0 (ε 0.2): r 1.5, A +2 → max(−3.0, −2.4) = −2.4 (clipped: no gain past 1.2)
#                     r 0.5, A −1 → max(0.5, 0.8) = 0.8 (clipped: no gain below 0.8)
#   member 1 (ε 0.1): r 1.05, A +1 → −1.05 (inside the range)
#                     r 0.7, A +1 → max(−0.7, −0.9) = −0.7 (unclipped: a worse ratio is never excused)
#                     r 1.5, A −2 → max(3.0, 2.2) = 3.0 (unclipped, likewise)
PG = [(-2.4 + 0.8) / 4, (-1.05 - 0.7 + 3.0) / 3]
V = [0.5 * (1.0 + 4.0) / 4, 0.5 * (1.0 + 4.0 + 9.0) / 3]
H = [(0.7 + 0.3) / 4, 3.0 / 3]
TOTAL = [PG[0] - 0.01 * H[0] + 0.5 * V[0], PG[1] - 0.0 * H[1] + 1.0 * V[1]]
# d pg / d new_logp = −A·r / norm where the unclipped term is taken, 0 where the clipped one is.
PG_GRAD = [[0.0, 0.0, 0.0], [-1.05 / 3, -0.7 / 3, 3.0 / 3]]


def test_ppo_loss_by_hand() -> None:
    new_logp = t([[math.log(r) for r in row] for row in RATIOS]).requires_grad_(True)
    loss = ppo_loss(
        new_logp,
        torch.zeros_like(new_logp),
        ADVANTAGES,
        VALUES,
        TARGETS,
        ENTROPY,
        MASK,
        NORM,
        clip_coef=CLIP,
        ent_coef=ENT,
        vf_coef=VF,
    )
    torch.testing.assert_close(loss.pg_loss, torch.tensor(PG, dtype=F64))
    torch.testing.assert_close(loss.v_loss, torch.tensor(V, dtype=F64))
    torch.testing.assert_close(loss.entropy, torch.tensor(H, dtype=F64))
    torch.testing.assert_close(loss.total, torch.tensor(TOTAL, dtype=F64))
    (grad,) = torch.autograd.grad(loss.pg_loss.sum(), new_logp)
    torch.testing.assert_close(grad, t(PG_GRAD))


def test_advantages_are_normalized_per_member_over_valid_samples_as_numpy_does() -> None:
    rng = np.random.default_rng(0)
    adv = rng.normal(3.0, 2.0, (3, 6))
    mask = np.ones((3, 6))
    mask[0, 4:] = 0  # member 0: four valid samples
    mask[2, 1:] = 0  # member 2: one, too few to normalize
    out = normalize_advantages(torch.from_numpy(adv), torch.from_numpy(mask)).numpy()
    for member, valid in ((0, slice(0, 4)), (1, slice(0, 6))):
        x = adv[member, valid]
        np.testing.assert_allclose(out[member, valid], (x - x.mean()) / (x.std(ddof=1) + 1e-8), rtol=1e-12)
    np.testing.assert_array_equal(out[2], adv[2])
    np.testing.assert_array_equal(
        normalize_advantages(torch.from_numpy(adv), torch.from_numpy(mask), enabled=False).numpy(), adv
    )


@pytest.mark.parametrize(
    ("counts", "minibatches", "world", "expected"),
    [
        ([10, 0], 4, 2, [10 / 8, 1 / 8]),  # a member with no samples divides by 1, not 0
        ([6, 6], 1, 1, [6.0, 6.0]),
    ],
)
def test_loss_normalizers(counts: list[int], minibatches: int, world: int, expected: list[float]) -> None:
    torch.testing.assert_close(
        loss_normalizers(torch.tensor(counts), minibatches, world), torch.tensor(expected, dtype=torch.float32)
    )
