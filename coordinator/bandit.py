"""DvD's adaptive diversity weight (Parker-Holder et al. 2020) as pure functions: a Thompson-sampling
bandit over λ ∈ {0, `diversity_weight`} that keeps the weight that has been raising the
population's best fitness.

As the authors' `BayesianBandits` (DvD_ES, bandits.py; arms 0 and 0.5 there):

    choice k is made when the population's best fitness is f_k, and is judged by f_{k+1}:
        score_k = 1 if f_{k+1} > max(f_{k-5} .. f_{k-1}), ½ if equal, 0 if lower
    (their rolling window of 5 ends one before f_k); the first choice that has such a window
    is not scored, and only the last 50 scored choices count:
        arm a: Beta(1 + Σ score, 1 + count − Σ score) over its choices
    until 6 choices are made they are uniform; then each arm's Beta is sampled, the largest wins.

Choice 0 is the run's start, at the configured weight (the last arm) and no fitness (−∞). The
coordinator keeps no other state: the later choices and fitnesses are the logged decisions
(coordinator/population.py), and the generator is seeded by the run's seed and the decision's id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PREVIOUS = 5  # fitnesses a choice's outcome is measured against
WINDOW = 50  # scored choices the posterior counts
UNIFORM_CHOICES = PREVIOUS + 1  # choices made uniformly before the posterior decides


def scores(choices: Sequence[int], fitness: Sequence[float]) -> list[tuple[int, float]]:
    """(arm, score) of each choice that can be scored, oldest first: choice k was made at fitness
    f_k (`fitness[k]`) and is judged by `fitness[k + 1]`."""
    scored = []
    for k in range(PREVIOUS, min(len(choices), len(fitness) - 1)):
        before = max(fitness[k - PREVIOUS : k])
        scored.append((choices[k], (float(np.sign(fitness[k + 1] - before)) + 1) / 2))
    return scored[1:][-WINDOW:]


def posterior(choices: Sequence[int], fitness: Sequence[float], arms: int) -> tuple[np.ndarray, np.ndarray]:
    """Each arm's Beta parameters (α, β) [arms] from the scored choices."""
    alpha, beta = np.ones(arms), np.ones(arms)
    for arm, score in scores(choices, fitness):
        alpha[arm] += score
        beta[arm] += 1 - score
    return alpha, beta


def choose(choices: Sequence[int], fitness: Sequence[float], arms: int, rng: np.random.Generator) -> int:
    """The next arm, after `choices` made at `fitness` (which holds one more: the fitness now)."""
    if len(choices) < UNIFORM_CHOICES:
        return int(rng.integers(arms))
    alpha, beta = posterior(choices, fitness, arms)
    return int(np.argmax(rng.beta(alpha, beta)))
