"""PBT selection and perturbation: pure, seeded functions (coordinator/pbt.py), and where a population starts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.loading import from_mapping
from rlmq.coordinator import pbt
from rlmq.coordinator.population import Population
from rlmq.coordinator.store import RunStore

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


@pytest.mark.parametrize("start", ["drawn", "config"])
def test_a_population_starts_drawn_from_the_ranges_or_at_the_config(redis_url: str, run_id: str, start: str) -> None:
    """Jaderberg et al.'s start, each member's learning rate its own draw, or AgileRL's, every member
    at the run's settings: there the ranges bound only where explore may take a copy."""
    pbt_cfg = PBTConfig(start=start, ranges={"learning_rate": HyperRange(1e-4, 1e-2, log=True)})
    run_config = RunConfig(population=4, pbt=pbt_cfg, ppo=PPOConfig(learning_rate=2e-3))
    rates = [
        r.hyperparams["learning_rate"]
        for r in Population(RunStore.connect(redis_url, run_id), run_config).records.values()
    ]
    if start == "config":
        assert rates == [2e-3] * 4
    else:
        assert len(set(rates)) == 4 and 2e-3 not in rates
    with pytest.raises(ValueError, match="pbt.start 'tuned' is not drawn or config"):
        PBTConfig(start="tuned")


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
    returns = {0: [10.0, 12.0], 1: [200.0, 198.0], 2: [50.0, 40.0], 3: [120.0, 110.0]}
    first = pbt.decide(cfg, returns, 0, members, pbt.decision_rng(0, 7))
    assert first is not None and first.source == 1
    assert first == pbt.decide(cfg, returns, 0, members, pbt.decision_rng(0, 7))
    lr = first.hyperparams["learning_rate"]
    assert 1e-4 <= lr <= 1e-2 and lr != members[0]["learning_rate"]
    assert {k: v for k, v in first.hyperparams.items() if k != "learning_rate"} == {
        k: v for k, v in members[1].items() if k != "learning_rate"
    }
    assert pbt.decide(cfg, returns, 1, members, pbt.decision_rng(0, 8)) is None  # the best carries on
    assert pbt.decide(cfg, {1: [200.0], 2: [50.0]}, 0, members, pbt.decision_rng(0, 9)) is None  # no fitness yet


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [  # Student's t table (e.g. Abramowitz & Stegun, table 26.10)
        (0.95, 5, 2.015),
        (0.95, 10, 1.812),
        (0.975, 20, 2.086),
        (0.99, 30, 2.457),
        (0.95, 1e9, 1.645),
    ],
)
def test_t_quantile_matches_the_table(p: float, df: float, table: float) -> None:
    assert pbt.t_quantile(p, df) == pytest.approx(table, abs=1.5e-3)


def test_welch_t_is_the_textbook_statistic() -> None:
    a, b = [3.0, 5.0, 7.0, 9.0], [1.0, 2.0, 3.0]  # means 6, 2; variances 20/3, 1
    t, df = pbt.welch_t(a, b)
    va, vb = (20 / 3) / 4, 1 / 3
    assert t == pytest.approx(4 / np.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 2))
    assert pbt.welch_t(b, a)[0] == pytest.approx(-t)
    assert pbt.welch_t([2.0, 2.0], [1.0, 1.0, 1.0]) == (np.inf, 3.0)  # constant samples: certain
    assert pbt.welch_t([1.0, 1.0], [1.0, 1.0])[0] == 0.0


def test_ttest_copies_only_a_member_significantly_fitter() -> None:
    rng = np.random.default_rng(4)
    draws = np.random.default_rng(5)
    target = list(draws.normal(0.0, 3.0, 50))
    clearly_better = list(draws.normal(10.0, 3.0, 50))
    noise_above = [r + 0.5 for r in target[::-1]]  # higher, by a sixth of the scatter: t ≈ 0.8
    assert pbt.ttest_source({0: target, 1: clearly_better}, 0, 0.95, rng) == 1
    assert all(pbt.ttest_source({0: target, 2: noise_above}, 0, 0.95, rng) is None for _ in range(20))
    assert pbt.ttest_source({1: clearly_better, 0: target}, 1, 0.95, rng) is None  # the worse is never copied
    assert pbt.ttest_source({0: target}, 0, 0.95, rng) is None
    # the member compared with is drawn uniformly among the others
    returns = {0: target, 1: clearly_better, 2: noise_above, 3: list(draws.normal(10.0, 3.0, 50))}
    sources = [pbt.ttest_source(returns, 0, 0.95, rng) for _ in range(300)]
    assert set(sources) == {1, 3, None} and 60 < sources.count(None) < 140


def test_ttest_selection_is_checked_at_the_entry_point() -> None:
    cfg = from_mapping(PBTConfig, {"selection": "ttest", "ttest_confidence": 0.9, "fitness_episodes": 30})
    assert cfg.selection == "ttest" and cfg.ttest_confidence == 0.9
    with pytest.raises(ValueError, match="fitness_episodes of at least 2"):
        from_mapping(PBTConfig, {"selection": "ttest", "fitness_episodes": 1})
    with pytest.raises(ValueError, match=r"ttest_confidence must be in \[0.5, 1\)"):
        from_mapping(PBTConfig, {"ttest_confidence": 1.0})
    with pytest.raises(ValueError, match="not truncation, tournament or ttest"):
        from_mapping(PBTConfig, {"selection": "best"})
