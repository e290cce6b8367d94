"""V-trace and GAE against plain loop references written from the papers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import torch

from rlmq.learners.advantages import VTraceReturns, gae, vtrace


class Batch(NamedTuple):
    behaviour_logp: np.ndarray  # [T, B]
    target_logp: np.ndarray
    rewards: np.ndarray
    values: np.ndarray  # [T + 1, B]
    terminated: np.ndarray  # bool
    truncated: np.ndarray
    valid: np.ndarray


def random_batch(seed: int, next_step_reset: bool = True) -> Batch:
    """Random data with episode ends where a Gymnasium next-step autoreset puts them: the step
    after a done is the reset step (invalid, not itself done), and a rollout may open on one.
    Without `next_step_reset` every step is valid (a same-step autoreset): then only the done
    flags stop the traces."""
    rng = np.random.default_rng(seed)
    steps, slots = int(rng.integers(7, 21)), int(rng.integers(3, 6))
    terminated = np.zeros((steps, slots), bool)
    truncated = np.zeros((steps, slots), bool)
    valid = np.ones((steps, slots), bool)
    for b in range(slots):
        valid[0, b] = rng.random() > 0.25  # the previous rollout ended on a done
        for t in range(steps):
            if not next_step_reset:
                valid[t, b] = True
            elif t > 0 and (terminated[t - 1, b] or truncated[t - 1, b]):
                valid[t, b] = False
            if valid[t, b]:
                terminated[t, b] = rng.random() < 0.15
                truncated[t, b] = rng.random() < 0.15  # both at once happens too
    behaviour_logp = -2.0 * rng.random((steps, slots))
    target_logp = behaviour_logp + 0.7 * rng.standard_normal((steps, slots))
    return Batch(
        behaviour_logp=behaviour_logp,
        target_logp=target_logp,
        rewards=rng.standard_normal((steps, slots)),
        values=rng.standard_normal((steps + 1, slots)),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )


# --- references: one slot at a time, one sum per step, as the papers write them ------------


def reference_vtrace(
    batch: Batch, gamma: float, lam: float, rho_bar: float, c_bar: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IMPALA eq. 1: v_s = V(x_s) + sum_{t>=s} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t, with
    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), rho_t = min(rho_bar, pi/mu),
    c_i = lam min(c_bar, pi/mu). The sum stops after the step that ends an episode; a terminated
    step's next value is 0. Policy-gradient advantage: rho_s (r_s + gamma v_{s+1} - V(x_s)), with
    v_{s+1} replaced by V(x_{s+1}) past the rollout or an episode end."""
    steps, slots = batch.rewards.shape
    vs = np.zeros((steps, slots))
    pg = np.zeros((steps, slots))
    ratio = np.exp(batch.target_logp - batch.behaviour_logp)
    for b in range(slots):
        V = batch.values[:, b]
        for s in range(steps):
            if not batch.valid[s, b]:
                vs[s, b] = V[s]
                continue
            total, weight = 0.0, 1.0  # weight = gamma^(t-s) prod c_i
            for t in range(s, steps):
                if not batch.valid[t, b]:
                    break
                next_value = 0.0 if batch.terminated[t, b] else V[t + 1]
                delta = min(rho_bar, ratio[t, b]) * (batch.rewards[t, b] + gamma * next_value - V[t])
                total += weight * delta
                if batch.terminated[t, b] or batch.truncated[t, b]:
                    break
                weight *= gamma * lam * min(c_bar, ratio[t, b])
            vs[s, b] = V[s] + total
        for s in range(steps):
            if not batch.valid[s, b]:
                continue
            done = batch.terminated[s, b] or batch.truncated[s, b]
            next_vs = V[s + 1] if done or s == steps - 1 else vs[s + 1, b]
            if batch.terminated[s, b]:
                next_vs = 0.0
            pg[s, b] = min(rho_bar, ratio[s, b]) * (batch.rewards[s, b] + gamma * next_vs - V[s])
    return vs, pg, np.minimum(rho_bar, ratio)


def reference_gae(batch: Batch, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Schulman et al.: A_s = sum_{t>=s} (gamma lam)^(t-s) delta_t, delta_t = r_t + gamma V(x_{t+1})
    - V(x_t), the sum stopping after an episode end; returns = A + V."""
    steps, slots = batch.rewards.shape
    advantages = np.zeros((steps, slots))
    for b in range(slots):
        V = batch.values[:, b]
        for s in range(steps):
            if not batch.valid[s, b]:
                continue
            total, weight = 0.0, 1.0
            for t in range(s, steps):
                next_value = 0.0 if batch.terminated[t, b] else V[t + 1]
                total += weight * (batch.rewards[t, b] + gamma * next_value - V[t])
                if batch.terminated[t, b] or batch.truncated[t, b]:
                    break
                weight *= gamma * lam
            advantages[s, b] = total
    return advantages, advantages + batch.values[:-1]


def tensors(batch: Batch, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    as_float = {"dtype": dtype}
    return {
        "rewards": torch.tensor(batch.rewards, **as_float),
        "values": torch.tensor(batch.values, **as_float),
        "terminated": torch.tensor(batch.terminated),
        "truncated": torch.tensor(batch.truncated),
        "valid": torch.tensor(batch.valid),
    }


def run_vtrace(batch: Batch, dtype: torch.dtype = torch.float64, **kwargs: float) -> VTraceReturns:
    return vtrace(
        torch.tensor(batch.behaviour_logp, dtype=dtype),
        torch.tensor(batch.target_logp, dtype=dtype),
        **tensors(batch, dtype),
        **kwargs,
    )


# --- random inputs --------------------------------------------------------------------------


def test_random_batches_have_every_kind_of_step() -> None:
    batches = [random_batch(seed) for seed in range(6)]
    assert sum(b.terminated.sum() for b in batches) > 5
    assert sum(b.truncated.sum() for b in batches) > 5
    assert sum((~b.valid).sum() for b in batches) > 10
    assert sum((b.terminated & b.truncated).sum() for b in batches) >= 1
    ratios = np.concatenate([np.exp(b.target_logp - b.behaviour_logp).ravel() for b in batches])
    assert (ratios > 2).any() and (ratios < 0.5).any()


@pytest.mark.parametrize("next_step_reset", [True, False], ids=["next-step", "same-step"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("lam", "rho_bar", "c_bar"),
    [(1.0, 1.0, 1.0), (0.9, 1.0, 1.0), (0.95, 2.0, 0.8), (0.8, 1e9, 1e9)],
)
def test_vtrace_matches_reference(seed: int, lam: float, rho_bar: float, c_bar: float, next_step_reset: bool) -> None:
    batch = random_batch(seed, next_step_reset)
    gamma = 0.97
    vs, pg, rhos = reference_vtrace(batch, gamma, lam, rho_bar, c_bar)
    out = run_vtrace(batch, gamma=gamma, lam=lam, rho_bar=rho_bar, c_bar=c_bar)
    np.testing.assert_allclose(out.vs.numpy(), vs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.clipped_rhos.numpy(), rhos, atol=1e-5, rtol=1e-6)
    assert out.vs.shape == batch.rewards.shape
    invalid = ~batch.valid
    np.testing.assert_array_equal(out.pg_advantages.numpy()[invalid], 0.0)
    np.testing.assert_allclose(out.vs.numpy()[invalid], batch.values[:-1][invalid], atol=1e-6)


@pytest.mark.parametrize("next_step_reset", [True, False], ids=["next-step", "same-step"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("lam", [1.0, 0.95, 0.0])
def test_gae_matches_reference(seed: int, lam: float, next_step_reset: bool) -> None:
    batch = random_batch(seed, next_step_reset)
    advantages, returns = reference_gae(batch, gamma=0.97, lam=lam)
    out = gae(**tensors(batch), gamma=0.97, lam=lam)
    np.testing.assert_allclose(out.advantages.numpy(), advantages, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out.returns.numpy(), returns, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(out.advantages.numpy()[~batch.valid], 0.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_on_policy_vtrace_targets_are_gae_returns(seed: int, lam: float) -> None:
    batch = random_batch(seed)._replace(target_logp=random_batch(seed).behaviour_logp)
    out = run_vtrace(batch, gamma=0.99, lam=lam, rho_bar=1.0, c_bar=1.0)
    reference = gae(**tensors(batch), gamma=0.99, lam=lam)
    np.testing.assert_allclose(out.vs.numpy(), reference.returns.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(out.clipped_rhos.numpy(), 1.0)
    if lam == 1.0:  # one-step advantages on λ-returns telescope to GAE(λ = 1)
        np.testing.assert_allclose(out.pg_advantages.numpy(), reference.advantages.numpy(), atol=1e-5, rtol=0)


def test_float32_in_float32_out() -> None:
    batch = random_batch(0)
    wide = run_vtrace(batch, torch.float64, gamma=0.97, lam=0.95)
    narrow = run_vtrace(batch, torch.float32, gamma=0.97, lam=0.95)
    assert narrow.vs.dtype == narrow.pg_advantages.dtype == torch.float32
    np.testing.assert_allclose(narrow.vs.numpy(), wide.vs.numpy(), atol=1e-4, rtol=0)
    assert gae(**tensors(batch, torch.float32), gamma=0.97, lam=0.95).returns.dtype == torch.float32


# --- by hand --------------------------------------------------------------------------------
#
# T = 2, B = 1, gamma = 0.5, lam = 1, rho_bar = c_bar = 1, rewards (3, 2), values (1, 2, 4),
# pi/mu = (2, 0.5), so rho = c = (1, 0.5).
#
# no episode end:
#   delta_1 = 0.5 (2 + 0.5·4 − 2) = 1                       vs_1 = 2 + 1 = 3
#   delta_0 = 1 (3 + 0.5·2 − 1) = 3                         vs_0 = 1 + 3 + 0.5·1·1 = 4.5
#   pg_0 = 1 (3 + 0.5·vs_1 − 1) = 3.5                       pg_1 = 0.5 (2 + 0.5·4 − 2) = 1
#   GAE: A_1 = 2 + 2 − 2 = 2, A_0 = (3 + 1 − 1) + 0.5·2 = 4; returns (5, 4)
# truncated at t = 0 (step 1 is the reset step, invalid):
#   delta_0 = 3, the trace stops: vs_0 = 4; pg_0 = 3 + 0.5·V(x_1) − 1 = 3 (V, not vs_1)
#   vs_1 = V(x_1) = 2, pg_1 = 0; GAE: A = (3, 0), returns (4, 2)
# terminated at t = 0:
#   delta_0 = 1 (3 + 0 − 1) = 2: vs_0 = 3, pg_0 = 2; vs_1 = 2, pg_1 = 0; GAE: A = (2, 0), returns (3, 2)
def column(values: tuple[float, ...] | list[float]) -> np.ndarray:
    return np.array(values)[:, None]  # [T] -> [T, B = 1]


HAND_CASES = [
    ("running", (False, False), (False, False), (True, True), (4.5, 3.0), (3.5, 1.0), (4.0, 2.0)),
    ("truncated", (False, False), (True, False), (True, False), (4.0, 2.0), (3.0, 0.0), (3.0, 0.0)),
    ("terminated", (True, False), (False, False), (True, False), (3.0, 2.0), (2.0, 0.0), (2.0, 0.0)),
]


@pytest.mark.parametrize(
    ("terminated", "truncated", "valid", "vs", "pg", "advantages"),
    [case[1:] for case in HAND_CASES],
    ids=[case[0] for case in HAND_CASES],
)
def test_hand_computed(
    terminated: tuple[bool, bool],
    truncated: tuple[bool, bool],
    valid: tuple[bool, bool],
    vs: tuple[float, float],
    pg: tuple[float, float],
    advantages: tuple[float, float],
) -> None:
    batch = Batch(
        behaviour_logp=column([0.0, 0.0]),
        target_logp=column([np.log(2.0), np.log(0.5)]),
        rewards=column([3.0, 2.0]),
        values=column([1.0, 2.0, 4.0]),
        terminated=column(terminated),
        truncated=column(truncated),
        valid=column(valid),
    )
    out = run_vtrace(batch, torch.float64, gamma=0.5, lam=1.0, rho_bar=1.0, c_bar=1.0)
    np.testing.assert_allclose(out.vs.numpy()[:, 0], vs, atol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy()[:, 0], pg, atol=1e-12)
    np.testing.assert_allclose(out.clipped_rhos.numpy()[:, 0], [1.0, 0.5], atol=1e-12)
    returns = gae(**tensors(batch, torch.float64), gamma=0.5, lam=1.0)
    np.testing.assert_allclose(returns.advantages.numpy()[:, 0], advantages, atol=1e-12)
    np.testing.assert_allclose(returns.returns.numpy()[:, 0], np.add(advantages, [1.0, 2.0]), atol=1e-12)
    # the references agree with the hand numbers too
    ref_vs, ref_pg, _ = reference_vtrace(batch, 0.5, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(ref_vs[:, 0], vs, atol=1e-12)
    np.testing.assert_allclose(ref_pg[:, 0], pg, atol=1e-12)
    np.testing.assert_allclose(reference_gae(batch, 0.5, 1.0)[0][:, 0], advantages, atol=1e-12)
