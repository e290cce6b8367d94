"""Population-based training decisions as pure, seeded functions (Jaderberg et al. 2017; AgileRL).

When a member has trained `interval` env steps since the last decision about it, the coordinator
asks `decide` about it, the *target*:

- exploit: does it take another member's weights, optimizer state and hyperparameters?
    truncation: if it ranks in the bottom `fraction`, it copies a random member of the top `fraction`;
    tournament: it copies the fittest of `tournament_size` members drawn at random (possibly
    itself); with elitism the fittest member of all is left alone.
    ttest: it copies one other member drawn at random if that member's returns are higher by
    Welch's t-test at `ttest_confidence` (Jaderberg et al.'s "T-test selection"): with returns
    that scatter widely between episodes, a ranking of means copies noise, and each copy throws
    away a member's own line of training.
- explore: the hyperparameters it takes are perturbed, each multiplied by one of `perturb_factors`
  or, with probability `resample_probability`, drawn afresh, and kept within its range; where
  `activations` are listed, the hidden activation switches to another of them with probability
  `activation_probability` (AgileRL's activation mutation), the member gains or loses its last
  hidden layer with `layer_probability` (its layer mutation), and one hidden layer's width moves by
  one of `node_steps` with `node_probability` (its node mutation).

Randomness comes only from the generator passed in; the coordinator seeds one per decision from
(run seed, decision id), so a decision can be recomputed and every rule tested without a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from rlmq.common.architecture import activation_code, activation_named, layers_present, member_widths, width_name
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
    base: Mapping[str, float], ranges: Mapping[str, HyperRange], population: int, seed: int, start: str = "drawn"
) -> list[Hyperparams]:
    """Every member's starting hyperparameters: `base` (the run's algorithm settings) for a single
    agent or a population that starts at the config (`start` "config"); otherwise each ranged one
    drawn for each member (member 0 included)."""
    if population == 1 or start == "config":
        return [dict(base) for _ in range(population)]
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


def mutate_activation(
    hyperparams: Mapping[str, float], choices: Sequence[str], probability: float, rng: np.random.Generator
) -> Hyperparams:
    """AgileRL's activation mutation: with `probability`, the member's hidden activation (the
    "activation" hyperparameter, a code of ACTIVATIONS) becomes another of `choices`, drawn
    uniformly. The weights it copied were trained under the old one: the mutation is a jump, which
    selection then keeps or undoes."""
    out = dict(hyperparams)
    if rng.random() < probability:
        current = activation_named(out["activation"])
        out["activation"] = activation_code(str(rng.choice([c for c in choices if c != current])))
    return out


def mutate_widths(
    hyperparams: Mapping[str, float],
    steps: Sequence[int],
    probability: float,
    low: int,
    high: int,
    rng: np.random.Generator,
) -> Hyperparams:
    """AgileRL's node mutation: with `probability`, one hidden layer the member has, drawn
    uniformly, gains or loses (even odds) one of `steps` units, its width kept within [low, high]
    ("width.i")."""
    out = dict(hyperparams)
    widths = member_widths(out)
    if widths is not None and rng.random() < probability:
        layer = int(rng.integers(layers_present(widths)))
        change = int(rng.choice(np.asarray(steps))) * (1 if rng.random() < 0.5 else -1)
        out[width_name(layer)] = float(min(max(widths[layer] + change, low), high))
    return out


def mutate_depth(
    hyperparams: Mapping[str, float], probability: float, low: int, high: int, rng: np.random.Generator
) -> Hyperparams:
    """AgileRL's layer mutation: with `probability`, the member gains a hidden layer after its last,
    as wide as that one, or loses its last (even odds, where both keep it within [low, high]
    layers; "width.i" of a layer it lacks is 0)."""
    out = dict(hyperparams)
    widths = member_widths(out)
    if widths is None or rng.random() >= probability:
        return out
    present = layers_present(widths)
    can_add, can_remove = present < min(high, len(widths)), present > low
    if can_add and (not can_remove or rng.random() < 0.5):
        out[width_name(present)] = float(widths[present - 1])
    elif can_remove:
        out[width_name(present - 1)] = 0.0
    return out


def ranked(fitness: Mapping[int, float]) -> list[int]:
    """Members from the fittest down; ties go to the lower member id, so the order is total."""
    return sorted(fitness, key=lambda m: (-fitness[m], m))


def truncation_source(
    fitness: Mapping[int, float], target: int, fraction: float, rng: np.random.Generator
) -> int | None:
    """A top member for a target in the bottom `fraction` (at least one member each); else None."""
    order = ranked(fitness)
    cut = max(1, int(np.ceil(fraction * len(order))))
    if len(order) < 2 or target not in order[-cut:] or target in order[:cut]:
        return None
    return int(rng.choice(order[:cut]))


def tournament_source(
    fitness: Mapping[int, float], target: int, size: int, elitism: bool, rng: np.random.Generator
) -> int | None:
    """The fittest of `size` members drawn without replacement; None for the elite (with elitism)."""
    order = ranked(fitness)
    if elitism and order[0] == target:
        return None
    drawn = rng.choice(np.asarray(order), size=min(size, len(order)), replace=False)
    return min((int(m) for m in drawn), key=order.index)


def welch_t(higher: Sequence[float], lower: Sequence[float]) -> tuple[float, float]:
    """Welch's t statistic of mean(higher) − mean(lower) and its Welch–Satterthwaite degrees of
    freedom; each sample holds at least two values."""
    a, b = np.asarray(higher, dtype=np.float64), np.asarray(lower, dtype=np.float64)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff = float(a.mean() - b.mean())
    if va + vb == 0:  # both constant: any difference is certain
        return (math.copysign(math.inf, diff) if diff else 0.0), float(len(a) + len(b) - 2)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return diff / math.sqrt(va + vb), float(df)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: the Cornish–Fisher expansion in 1/df about the normal quantile
    (Abramowitz & Stegun 26.7.5): within 0.04 % of the exact value from 5 degrees of freedom on,
    for p up to 0.99."""
    z = NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(g / df ** (k + 1) for k, g in enumerate(terms))


def ttest_source(
    returns: Mapping[int, Sequence[float]], target: int, confidence: float, rng: np.random.Generator
) -> int | None:
    """Another member drawn at random, if its returns are higher than the target's by a one-sided
    Welch's t-test at `confidence`; else None."""
    others = sorted(m for m in returns if m != target)
    if not others:
        return None
    other = int(rng.choice(others))
    t, df = welch_t(returns[other], returns[target])
    return other if t > t_quantile(confidence, df) else None


def decide(
    cfg: PBTConfig,
    returns: Mapping[int, Sequence[float]],
    target: int,
    hyperparams: Sequence[Mapping[str, float]],
    rng: np.random.Generator,
) -> Choice | None:
    """The decision about `target`, or None to let it carry on as it is.

    `returns` holds the last `fitness_episodes` returns of each member that has that many (the
    others are not judged); a target not among them, or a population of fewer than two judged
    members, gets no decision yet. Fitness is the mean of those returns.
    """
    if target not in returns or len(returns) < 2:
        return None
    fitness = {m: float(np.mean(r)) for m, r in returns.items()}
    if cfg.selection == "truncation":
        source = truncation_source(fitness, target, cfg.fraction, rng)
    elif cfg.selection == "tournament":
        source = tournament_source(fitness, target, cfg.tournament_size, cfg.elitism, rng)
    else:
        source = ttest_source(returns, target, cfg.ttest_confidence, rng)
    if source is None:
        return None
    new = perturb(hyperparams[source], cfg.ranges, cfg.perturb_factors, cfg.resample_probability, rng)
    if cfg.activations:
        new = mutate_activation(new, cfg.activations, cfg.activation_probability, rng)
    if cfg.layer_probability:
        new = mutate_depth(new, cfg.layer_probability, cfg.min_layers, cfg.max_layers, rng)
    if cfg.node_probability:
        new = mutate_widths(new, cfg.node_steps, cfg.node_probability, cfg.min_width, cfg.max_width, rng)
    return Choice(source=source, hyperparams=new)
