"""Population-based training decisions as pure, seeded functions (Jaderberg et al. 2017; AgileRL).

When a member has trained `interval` env steps since the last decision about it, the coordinator
asks `decide` about it, the *target*:

- exploit: does it take another member's weights, optimizer state and hyperparameters?
    truncation: if it ranks in the bottom `fraction`, it copies a random member of the top `fraction`;
    tournament: it copies the fittest of `tournament_size` members drawn at random (possibly
    itself); with elitism the fittest member of all is left alone.
- explore: the hyperparameters it takes are perturbed, each multiplied by one of `perturb_factors`
  or, with probability `resample_probability`, drawn afresh, and kept within its range.

Randomness comes only from the generator passed in; the coordinator seeds one per decision from
(run seed, decision id), so a decision can be recomputed and every rule tested without a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlmq.common.config import HyperRange, PBTConfig

Hyperparams = dict[str, float]


@dataclass(frozen=True)
class Choice:
    """What becomes of the target: it copies `source` (itself: explore only) and takes `hyperparams`."""

    source: int
    hyperparams: Hyperparams


def decision_rng(seed: int, decision_id: int) -> np.random.Generator:
    return np.random.default_rng([seed, decision_id])


def sample_value(r: HyperRange, rng: np.random.Generator) -> float:
    if r.log:
        return float(np.exp(rng.uniform(np.log(r.low), np.log(r.high))))
    return float(rng.uniform(r.low, r.high))


def initial_hyperparams(
    base: Mapping[str, float], ranges: Mapping[str, HyperRange], population: int, seed: int
) -> list[Hyperparams]:
    """Every member's starting hyperparameters: `base` (the run's PPO settings) for a single agent;
    for a population, each ranged one drawn for each member (member 0 included)."""
    if population == 1:
        return [dict(base)]
    rng = np.random.default_rng([seed, 0])
    return [{**base, **{name: sample_value(ranges[name], rng) for name in sorted(ranges)}} for _ in range(population)]


def perturb(
    hyperparams: Mapping[str, float],
    ranges: Mapping[str, HyperRange],
    factors: Sequence[float],
    resample_probability: float,
    rng: np.random.Generator,
) -> Hyperparams:
    """Explore: each ranged hyperparameter scaled by a random factor or resampled, within bounds."""
    out = dict(hyperparams)
    for name in sorted(ranges):
        r = ranges[name]
        if rng.random() < resample_probability:
            value = sample_value(r, rng)
        else:
            value = out[name] * float(rng.choice(np.asarray(factors)))
        out[name] = float(min(max(value, r.low), r.high))
    return out


def ranked(fitness: Mapping[int, float]) -> list[int]:
    """Members from the fittest down; ties go to the lower member id, so the order is total."""
    return sorted(fitness, key=lambda m: (-fitness[m], m))


def truncation_source(fitness: Mapping[int, float], target: int, fraction: float,
                      rng: np.random.Generator) -> int | None:
    """A top member for a target in the bottom `fraction` (at least one member each); else None."""
    order = ranked(fitness)
    cut = max(1, int(np.ceil(fraction * len(order))))
    if len(order) < 2 or target not in order[-cut:] or target in order[:cut]:
        return None
    return int(rng.choice(order[:cut]))


def tournament_source(fitness: Mapping[int, float], target: int, size: int, elitism: bool,
                      rng: np.random.Generator) -> int | None:
    """The fittest of `size` members drawn without replacement; None for the elite (with elitism)."""
    order = ranked(fitness)
    if elitism and order[0] == target:
        return None
    drawn = rng.choice(np.asarray(order), size=min(size, len(order)), replace=False)
    return min((int(m) for m in drawn), key=order.index)


def decide(cfg: PBTConfig, fitness: Mapping[int, float], target: int,
           hyperparams: Sequence[Mapping[str, float]], rng: np.random.Generator) -> Choice | None:
    """The decision about `target`, or None to let it carry on as it is.

    `fitness` holds only members with enough episodes to judge; a target not among them, or a
    population of fewer than two judged members, gets no decision yet.
    """
    if target not in fitness or len(fitness) < 2:
        return None
    if cfg.selection == "truncation":
        source = truncation_source(fitness, target, cfg.fraction, rng)
    else:
        source = tournament_source(fitness, target, cfg.tournament_size, cfg.elitism, rng)
    if source is None:
        return None
    new = perturb(hyperparams[source], cfg.ranges, cfg.perturb_factors, cfg.resample_probability, rng)
    return Choice(source=source, hyperparams=new)
