"""Which weights an actor adopts, from each of its two sources, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlmq.actors.held_policy import HeldPolicy
from rlmq.common import envs, wire
from rlmq.common.config import RunConfig
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

CARTPOLE = envs.probe("CartPole-v1")
RUN = RunConfig(env_id="CartPole-v1", algo="ppo", hidden_sizes=(8,))
OBS = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)


def weights(version: int, seed: int, member: int = 0) -> wire.Weights:
    torch.manual_seed(seed)
    return wire.Weights(member=member, version=version, params=to_numpy_params(ActorCritic(CARTPOLE, (8,))))


def logits(held: HeldPolicy) -> np.ndarray:
    assert held.policy is not None
    return held.policy.forward(OBS)


def test_a_learner_gives_whatever_it_holds_now_older_or_not() -> None:
    """A restarted learner world counts on from its predecessor's last publication."""
    held = HeldPolicy(RUN, CARTPOLE, member=0)
    assert held.policy is None and held.version == -1
    assert held.offer(weights(9, seed=1), "learner") and held.version == 9
    first = logits(held)
    assert not held.offer(weights(9, seed=2), "learner")  # the one we hold
    np.testing.assert_array_equal(logits(held), first)
    assert held.offer(weights(6, seed=2), "learner") and held.version == 6
    assert not held.offer(weights(6, seed=3), "learner")  # the one we hold
    assert held.offer(weights(7, seed=3), "learner") and held.version == 7


def test_the_coordinators_assign_counts_only_while_none_is_held() -> None:
    held = HeldPolicy(RUN, CARTPOLE, member=0)
    assert held.offer(weights(5, seed=1), "assign") and held.version == 5
    assert not held.offer(weights(8, seed=2), "assign")  # the next credit brings the learner's
    assert held.version == 5


def test_another_members_or_misfit_weights_are_refused_and_the_held_policy_stays() -> None:
    held = HeldPolicy(RUN, CARTPOLE, member=1)
    held.offer(weights(2, seed=1, member=1), "learner")
    before = logits(held)
    with pytest.raises(wire.WireError) as other:
        held.offer(weights(3, seed=2, member=0), "learner")
    assert other.value.reason == "unknown_member"
    misfit = wire.Weights(member=1, version=3, params={"w": np.zeros(1, np.float32)})
    with pytest.raises(wire.WireError) as bad:
        held.offer(misfit, "learner")
    assert bad.value.reason == "bad_weights"
    assert held.version == 2
    np.testing.assert_array_equal(logits(held), before)
