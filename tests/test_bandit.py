"""DvD's adaptive weight (coordinator/bandit.py) against the authors' own procedure: their bandit
(DvD_ES, bandits.py) scores its choices with pandas rolling windows over the rewards seen, and
that computation, written out again here with pandas, must give the same posteriors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlmq.coordinator import bandit

SENTINEL = -99999.0  # the authors' first "reward", before any choice


def authors_posterior(choices: list[int], rewards: list[float], arms: int) -> tuple[list[float], list[float]]:
    """`update_dists` as DvD_ES computes it, with window 50, rolling 1 and prev 5: each choice's
    feedback is the reward after it less the best of the five rewards before the one it was made
    at; the first row with both is dropped, then the last 50 count."""
    table = pd.DataFrame({"choice": [*choices, 9999], "reward": rewards})
    table["before"] = table.reward.rolling(5).max().shift(1)
    table["after"] = table.reward.rolling(1).max().shift(-1)
    table["feedback"] = table.after - table.before
    table = table[~table.feedback.isna()].reset_index(drop=True).iloc[1:].iloc[-50:]
    table["bern"] = (np.sign(table.feedback) + 1) / 2
    alpha = [1 + float(table[table.choice == a].bern.sum()) for a in range(arms)]
    beta = [1 + float((table.choice == a).sum()) - (alpha[a] - 1) for a in range(arms)]
    return alpha, beta


@pytest.mark.parametrize("length", [3, 6, 7, 12, 80])
def test_the_posterior_is_the_authors_over_any_history(length: int) -> None:
    rng = np.random.default_rng(length)
    choices = rng.integers(2, size=length).tolist()
    rewards = [SENTINEL, *np.round(rng.normal(size=length), 1).tolist()]  # rounded: ties happen
    alpha, beta = bandit.posterior(choices, rewards, 2)
    want_alpha, want_beta = authors_posterior(choices, rewards, 2)
    np.testing.assert_allclose(alpha, want_alpha)
    np.testing.assert_allclose(beta, want_beta)
    assert len(bandit.scores(choices, rewards)) == max(min(length - 6, 50), 0)


def test_choices_are_uniform_at_first_then_follow_the_arm_that_raised_the_best_fitness() -> None:
    rng = np.random.default_rng(0)
    first = [bandit.choose([1] * n, [SENTINEL] + [0.0] * n, 2, rng) for n in range(1, 6) for _ in range(200)]
    assert 0.4 < np.mean(first) < 0.6
    # Arm 1 was followed by a new best every time, arm 0 by a fall.
    choices, fitness = [0, 1] * 20, [SENTINEL, 0.0]
    for arm in choices[1:]:
        fitness.append(max(fitness) + 1.0 if arm == 1 else fitness[-1] - 5.0)
    alpha, beta = bandit.posterior(choices, fitness, 2)
    assert alpha[0] == 1 and beta[1] == 1 and alpha[1] > 10 and beta[0] > 10
    picks = [bandit.choose(choices, fitness, 2, np.random.default_rng(s)) for s in range(100)]
    assert sum(picks) == 100
