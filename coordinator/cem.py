"""The cross-entropy method of CEM-RL (Pourchot & Sigaud 2019) as pure, seeded functions.

A population's actors are drawn from a Gaussian over the flat actor weights with a diagonal
covariance. After each generation the `elites` fittest members move it:

    λ_i  = log((K + 1) / i) / Σ_j log((K + 1) / j)      i = 1..K, the elites by rank
    μ'   = Σ_i λ_i z_i
    ε'   = τ ε + (1 − τ) ε_end                          the added noise decays towards ε_end
    σ²'  = Σ_i λ_i (z_i − μ)² / K + ε'                  around the *old* mean (Hansen 2016, eq. 12)

The paper's equation 3 has no 1/K; the authors' code (CEM-RL's `sepCEM`) and fastpbrl's
`cem.py` both divide by K, and rlmq follows the code that produced the published curves. Samples
are antithetic (μ ± the same draw), as fastpbrl's, so that a generation's mean is exactly μ.
Randomness comes only from the generator passed in: the coordinator seeds one per generation.
A member's actor is a vector here as its parameters flattened in name order (`flatten`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlmq.common.population import CEMConfig


@dataclass(frozen=True)
class Distribution:
    """The search distribution over flat actor weights: mean μ and diagonal variance σ² [D]
    (float64), and ε, the noise the next update adds."""

    mean: np.ndarray
    variance: np.ndarray
    noise: float
    generation: int = 0  # updates applied


def initial(mean: np.ndarray, settings: CEMConfig) -> Distribution:
    """The distribution around one actor's initial weights."""
    mean = np.asarray(mean, np.float64).ravel()
    return Distribution(mean.copy(), np.full_like(mean, settings.initial_variance), settings.initial_noise)


def elite_weights(elites: int) -> np.ndarray:
    """λ_1..λ_K: log-rank weights, the fittest first, summing to 1."""
    raw = np.log((elites + 1) / np.arange(1, elites + 1))
    normalized: np.ndarray = raw / raw.sum()
    return normalized


def ranked(fitness: Sequence[float] | np.ndarray) -> np.ndarray:
    """Member indices, fittest first; ties go to the lower index (a stable ranking)."""
    order: np.ndarray = np.argsort(-np.asarray(fitness, np.float64), kind="stable")
    return order


def update(dist: Distribution, members: np.ndarray, fitness: Sequence[float], settings: CEMConfig) -> Distribution:
    """The distribution after a generation whose members had weights `members` [P, D] and
    `fitness` [P], the `elites` first by `ranked`."""
    weights_of = np.asarray(members, np.float64)
    scores = np.asarray(fitness, np.float64)
    if weights_of.ndim != 2 or weights_of.shape[1] != dist.mean.size or scores.shape != (len(weights_of),):
        raise ValueError(f"members {weights_of.shape} and fitness {scores.shape} do not fit a mean of {dist.mean.size}")
    if len(weights_of) < settings.elites:
        raise ValueError(f"{len(weights_of)} members, fewer than cem.elites = {settings.elites}")
    if not np.isfinite(scores).all():
        raise ValueError("every member's fitness must be finite")
    elites, weights = weights_of[ranked(scores)[: settings.elites]], elite_weights(settings.elites)
    noise = settings.noise_decay * dist.noise + (1 - settings.noise_decay) * settings.final_noise
    variance = weights @ np.square(elites - dist.mean) / settings.elites + noise
    return Distribution(weights @ elites, variance, noise, dist.generation + 1)


def sample(dist: Distribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` members' weights [count, D]: μ + σ·ξ for ⌈count/2⌉ draws ξ, then μ − σ·ξ for the
    first ⌊count/2⌋ of them."""
    draws = rng.standard_normal(((count + 1) // 2, dist.mean.size)) * np.sqrt(dist.variance)
    noise = np.concatenate([draws, -draws[: count // 2]])
    drawn: np.ndarray = dist.mean + noise
    return drawn


def flatten(params: dict[str, np.ndarray]) -> np.ndarray:
    """An actor's parameters as one float64 vector, in name order."""
    return np.concatenate([np.asarray(params[name], np.float64).ravel() for name in sorted(params)])


def unflatten(vector: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`vector` cut back into `like`'s names, shapes and dtypes (the inverse of `flatten`)."""
    if vector.size != sum(a.size for a in like.values()):
        raise ValueError(f"a vector of {vector.size} does not fit parameters of {sum(a.size for a in like.values())}")
    params, start = {}, 0
    for name in sorted(like):
        shape, dtype, size = like[name].shape, like[name].dtype, like[name].size
        params[name] = vector[start : start + size].reshape(shape).astype(dtype)
        start += size
    return params
