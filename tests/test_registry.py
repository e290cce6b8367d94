"""Every algorithm is declared once: its entry in algorithms.ALGORITHMS, its actor policy in
models.POLICIES, its trainer in trainers.TRAINERS and its section of RunConfig, by the same name."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from rlmq.common.algorithms import ALGORITHMS
from rlmq.common.config import EvaluationConfig, PBTConfig, RunConfig
from rlmq.common.models import POLICIES
from rlmq.learners.trainers import TRAINERS


def test_every_registry_names_the_same_algorithms() -> None:
    hints = typing.get_type_hints(RunConfig)
    sections = {
        name
        for name, hint in hints.items()
        if dataclasses.is_dataclass(hint) and hint not in (PBTConfig, EvaluationConfig)
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
