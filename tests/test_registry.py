"""Every algorithm is declared once: its entry in algorithms.ALGORITHMS, its actor policy in
models.POLICIES, its trainer in trainers.TRAINERS and its section of RunConfig, by the same name."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rlmq.common.algorithms import ALGORITHMS, Batching, PPOConfig
from rlmq.common.config import EvaluationConfig, PBTConfig, RunConfig
from rlmq.common.models import POLICIES
from rlmq.common.population import CEMConfig, DvDConfig
from rlmq.learners.trainers import TRAINERS


def test_every_registry_names_the_same_algorithms() -> None:
    hints = typing.get_type_hints(RunConfig)
    sections = {
        name
        for name, hint in hints.items()
        if dataclasses.is_dataclass(hint) and hint not in (PBTConfig, CEMConfig, DvDConfig, EvaluationConfig)
    }
    assert set(ALGORITHMS) == set(POLICIES) == set(TRAINERS) == sections == {"ppo", "sac", "td3", "dqn"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_an_entry_names_its_section_and_tunes_fields_of_it(name: str) -> None:
    algorithm = ALGORITHMS[name]
    section = RunConfig(algo=name).algo_config
    assert type(section) is algorithm.config
    assert set(algorithm.tunable) <= {f.name for f in dataclasses.fields(section)}
    assert set(RunConfig(algo=name).base_hyperparams()) == set(algorithm.tunable)
    assert algorithm.action_kinds and set(algorithm.action_kinds) <= {"discrete", "continuous"}


def test_an_unknown_algorithm_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="ppo, sac, td3, dqn"):
        RunConfig(algo="a2c")


def test_the_learner_reads_how_to_batch_an_algorithm_from_its_entry() -> None:
    """An on-policy section (OnPolicyConfig) says how many rollouts an update takes and how old
    one may be; off-policy data go to the replay one rollout at a time, with no lag gate."""
    ppo = RunConfig(algo="ppo", rollouts_in_flight=8, ppo=PPOConfig(rollouts_per_batch=4, max_policy_lag=3))
    assert ppo.batching == Batching(rollouts_per_batch=4, max_rollouts_per_batch=0, max_policy_lag=3)
    assert ALGORITHMS["ppo"].on_policy and not any(ALGORITHMS[a].on_policy for a in ("sac", "td3", "dqn"))
    for algo in ("sac", "td3", "dqn"):
        assert RunConfig(algo=algo).batching == Batching(1, 0, None)
    with pytest.raises(ValueError, match="rollouts_in_flight must be at least ppo.rollouts_per_batch"):
        RunConfig(rollouts_in_flight=2, ppo=PPOConfig(rollouts_per_batch=4))
    with pytest.raises(ValueError, match="ppo: max_policy_lag >= 0"):
        PPOConfig(max_policy_lag=-1)
