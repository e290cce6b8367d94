"""The cross-entropy method of CEM-RL (coordinator/cem.py) against the paper's equations written
one weight and one elite at a time, with the authors' code's 1/K on the variance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlmq.common.population import CEMConfig
from rlmq.coordinator import cem


def reference_update(
    mean: list[float], members: list[list[float]], fitness: list[float], noise: float, s: CEMConfig
) -> tuple[list[float], list[float], float]:
    ranked = sorted(range(len(members)), key=lambda i: (-fitness[i], i))[: s.elites]
    raw = [math.log(1 + s.elites) - math.log(i) for i in range(1, s.elites + 1)]
    weights = [w / sum(raw) for w in raw]
    new_noise = s.noise_decay * noise + (1 - s.noise_decay) * s.final_noise
    new_mean, new_variance = [], []
    for d in range(len(mean)):
        new_mean.append(sum(w * members[i][d] for w, i in zip(weights, ranked, strict=True)))
        spread = sum(w * (members[i][d] - mean[d]) ** 2 for w, i in zip(weights, ranked, strict=True))
        new_variance.append(spread / s.elites + new_noise)
    return new_mean, new_variance, new_noise


def test_the_update_equals_the_papers_equations_elite_by_elite() -> None:
    settings = CEMConfig(elites=3, initial_variance=0.5, initial_noise=0.1, final_noise=0.01, noise_decay=0.9)
    rng = np.random.default_rng(0)
    dist = cem.initial(rng.normal(size=4), settings)
    for generation in range(3):
        members = rng.normal(size=(7, 4))
        fitness = [3.0, -1.0, 3.0, 10.0, 0.5, -7.0, 2.0]  # a tie: the lower index ranks first
        want = reference_update(dist.mean.tolist(), members.tolist(), fitness, dist.noise, settings)
        dist = cem.update(dist, members, fitness, settings)
        np.testing.assert_allclose(dist.mean, want[0], rtol=1e-12)
        np.testing.assert_allclose(dist.variance, want[1], rtol=1e-12)
        assert dist.noise == pytest.approx(want[2]) and dist.generation == generation + 1


def test_log_rank_weights_favour_the_fittest_and_sum_to_one() -> None:
    weights = cem.elite_weights(5)
    assert weights.sum() == pytest.approx(1.0) and (np.diff(weights) < 0).all()
    np.testing.assert_allclose(cem.elite_weights(2), np.log([3.0, 1.5]) / np.log(4.5))


def test_samples_are_antithetic_seeded_and_spread_as_the_variance_says() -> None:
    dist = cem.Distribution(np.array([1.0, -2.0, 0.0]), np.array([4.0, 0.25, 1e-6]), noise=0.0)
    drawn = cem.sample(dist, 5, np.random.default_rng(1))
    assert drawn.shape == (5, 3)
    np.testing.assert_allclose(drawn[:2] + drawn[3:], np.tile(2 * dist.mean, (2, 1)))  # μ + ξ beside μ − ξ
    np.testing.assert_array_equal(drawn, cem.sample(dist, 5, np.random.default_rng(1)))
    many = cem.sample(dist, 20_000, np.random.default_rng(2))
    np.testing.assert_allclose(many.mean(0), dist.mean, atol=1e-12)
    np.testing.assert_allclose(many.var(0), dist.variance, rtol=0.05)


def test_the_noise_decays_to_its_floor_and_the_elites_pull_the_mean() -> None:
    settings = CEMConfig(elites=2)
    dist = cem.initial(np.zeros(2), settings)
    for _ in range(300):
        dist = cem.update(dist, np.array([[1.0, 1.0], [1.0, 1.0], [9.0, 9.0]]), [5.0, 4.0, -1.0], settings)
    np.testing.assert_allclose(dist.mean, [1.0, 1.0])
    assert dist.noise == pytest.approx(settings.final_noise, rel=1e-3)
    np.testing.assert_allclose(dist.variance, dist.noise)  # the elites agree: only the noise is left


def test_bad_generations_are_refused_naming_what_is_wrong() -> None:
    settings = CEMConfig(elites=3)
    dist = cem.initial(np.zeros(2), settings)
    with pytest.raises(ValueError, match="fewer than cem.elites"):
        cem.update(dist, np.zeros((2, 2)), [1.0, 2.0], settings)
    with pytest.raises(ValueError, match="do not fit"):
        cem.update(dist, np.zeros((4, 3)), [1.0] * 4, settings)
    with pytest.raises(ValueError, match="finite"):
        cem.update(dist, np.zeros((4, 2)), [1.0, math.nan, 0.0, 2.0], settings)
    with pytest.raises(ValueError, match="at least 1"):
        CEMConfig(elites=0)
