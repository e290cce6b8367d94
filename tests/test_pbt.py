"""PBT selection and perturbation: pure, seeded functions (coordinator/pbt.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import HyperRange, PBTConfig
from rlmq.common.loading import from_mapping
from rlmq.coordinator import pbt

RANGES = {"learning_rate": HyperRange(1e-4, 1e-2, log=True), "ent_coef": HyperRange(0.0, 0.02)}
BASE = {"learning_rate": 2e-3, "ent_coef": 0.0, "gamma": 0.98}


def test_a_single_agent_keeps_the_run_settings() -> None:
    assert pbt.initial_hyperparams(BASE, RANGES, population=1, seed=3) == [BASE]


def test_initial_hyperparams_are_seeded_within_their_ranges_and_differ() -> None:
    members = pbt.initial_hyperparams(BASE, RANGES, population=64, seed=3)
    assert members == pbt.initial_hyperparams(BASE, RANGES, population=64, seed=3)
    assert members != pbt.initial_hyperparams(BASE, RANGES, population=64, seed=4)
    lrs = np.array([m["learning_rate"] for m in members])
    assert lrs.min() >= 1e-4 and lrs.max() <= 1e-2 and len(set(lrs)) == 64
    # log-uniform: about half below the geometric midpoint 1e-3 (uniform would put ~9 % there)
    assert 16 <= (lrs < 1e-3).sum() <= 48
    assert all(m["gamma"] == 0.98 for m in members)  # not ranged: the run's value


def test_perturb_multiplies_by_a_factor_or_resamples_and_stays_in_bounds() -> None:
    rng = np.random.default_rng(0)
    start = {"learning_rate": 1e-3, "ent_coef": 0.01, "gamma": 0.9}
    for _ in range(200):
        out = pbt.perturb(start, RANGES, (0.8, 1.25), 0.0, rng)
        assert out["learning_rate"] / 1e-3 == pytest.approx(0.8) or out["learning_rate"] / 1e-3 == pytest.approx(1.25)
        assert out["gamma"] == 0.9
    edge = {"learning_rate": 1e-2, "ent_coef": 0.02}
    for _ in range(200):  # at the top of the range, ×1.25 is clipped back to it
        out = pbt.perturb(edge, RANGES, (0.8, 1.25), 0.5, rng)
        assert 1e-4 <= out["learning_rate"] <= 1e-2 and 0.0 <= out["ent_coef"] <= 0.02
    resampled = [pbt.perturb(start, RANGES, (0.8, 1.25), 1.0, rng)["learning_rate"] for _ in range(100)]
    assert len({round(v / 1e-3, 6) for v in resampled} - {0.8, 1.25}) > 90  # drawn, not scaled


def test_truncation_bottom_copies_top_and_the_rest_carry_on() -> None:
    fitness = {m: float(10 * m) for m in range(8)}  # 7 fittest, 0 least
    rng = np.random.default_rng(1)
    sources = {pbt.truncation_source(fitness, target, 0.25, rng) for target in (0, 1) for _ in range(50)}
    assert sources == {6, 7}
    assert all(pbt.truncation_source(fitness, t, 0.25, rng) is None for t in range(2, 8))
    # two members: the worse copies the better; a single judged member decides nothing
    assert pbt.truncation_source({0: 1.0, 1: 2.0}, 0, 0.25, rng) == 1
    assert pbt.truncation_source({0: 1.0}, 0, 0.25, rng) is None


def test_tournament_with_elitism_never_replaces_the_best() -> None:
    rng = np.random.default_rng(2)
    for trial in range(200):
        fitness = {m: float(v) for m, v in enumerate(np.random.default_rng(trial).normal(size=6))}
        best = max(fitness, key=fitness.__getitem__)
        assert pbt.tournament_source(fitness, best, 3, True, rng) is None
        target = (best + 1) % 6
        source = pbt.tournament_source(fitness, target, 3, True, rng)
        assert source is not None
        # the winner is the fittest of three: at least two members are less fit
        assert sum(f < fitness[source] for f in fitness.values()) >= 2
    fitness = {0: 1.0, 1: 5.0, 2: 3.0}
    assert pbt.tournament_source(fitness, 0, 3, True, rng) == 1  # everyone drawn: the best wins
    assert pbt.tournament_source(fitness, 1, 3, False, rng) == 1  # no elitism: the best re-explores


def test_decide_is_reproducible_from_its_seed() -> None:
    cfg = from_mapping(PBTConfig, {"ranges": {"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}}})
    members = pbt.initial_hyperparams(dataclasses.asdict(PPOConfig()), cfg.ranges, 4, seed=0)
    fitness = {0: 10.0, 1: 200.0, 2: 50.0, 3: 120.0}
    first = pbt.decide(cfg, fitness, 0, members, pbt.decision_rng(0, 7))
    assert first is not None and first.source == 1
    assert first == pbt.decide(cfg, fitness, 0, members, pbt.decision_rng(0, 7))
    lr = first.hyperparams["learning_rate"]
    assert 1e-4 <= lr <= 1e-2 and lr != members[0]["learning_rate"]
    assert {k: v for k, v in first.hyperparams.items() if k != "learning_rate"} == {
        k: v for k, v in members[1].items() if k != "learning_rate"}
    assert pbt.decide(cfg, fitness, 1, members, pbt.decision_rng(0, 8)) is None  # the best carries on
    assert pbt.decide(cfg, {1: 200.0, 2: 50.0}, 0, members, pbt.decision_rng(0, 9)) is None  # no fitness yet
