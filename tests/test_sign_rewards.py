"""Atari's reward clipping (`RunConfig.sign_rewards`): a learner takes each rollout's rewards as
their signs as it arrives, so the rollout the actor sent (and the returns it reports) keep the
env's rewards. A learner service in-process, its real experience socket fed by a real DEALER."""

from __future__ import annotations

import numpy as np
import zmq

from rlmq.common import wire
from rlmq.common.config import LearnerConfig, RunConfig
from rlmq.common.schema import EnvSpec, allocate
from rlmq.common.service import StopFlag
from rlmq.learners.credits import CreditTimeouts
from rlmq.learners.learner import Learner
from rlmq.learners.members import MemberQueues

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
STEPS, SLOTS = 8, 2


def learner_given_a_rollout(rewards: np.ndarray, sign_rewards: bool | None, env_id: str) -> wire.Rollout:
    """The rollout a learner queued for training after an actor holding its credit sent it one
    with these `rewards`."""
    cfg = LearnerConfig(
        run="signs",
        coordinator="tcp://127.0.0.1:9",
        broadcast="tcp://127.0.0.1:9",
        metrics_port=-1,
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        experience_port=0,
    )
    learner = Learner(cfg, StopFlag())
    actor = zmq.Context.instance().socket(zmq.DEALER)
    try:
        learner.run_config = RunConfig(env_id=env_id, num_envs=SLOTS, rollout_length=STEPS, sign_rewards=sign_rewards)
        learner.spec = SPEC
        learner.members = MemberQueues(1, 1, CreditTimeouts(), 1, 2**62, 0.05, 0.25)
        learner.members.hello(b"actor-0", 0)
        learner.members.grant(lambda actor, member: None)  # the credit is out: the rollout is due
        actor.setsockopt(zmq.IDENTITY, b"actor-0")
        actor.connect(learner.sockets.endpoint)
        arrays = allocate(SPEC, STEPS, SLOTS, zeros=True)
        arrays["valid"][:] = True
        actor.send(
            wire.encode(wire.Rollout(member=0, policy_version=0, actor="actor-0", **{**arrays, "rewards": rewards}))
        )
        learner.receive(timeout_ms=5_000)
        (queued,) = learner.members.take().rollouts[0]
        return queued
    finally:
        actor.close(linger=0)
        learner.close()


def test_a_learner_trains_on_the_rewards_signs_when_the_run_says_so() -> None:
    rewards = np.array([[0.0, -3.5]] * 4 + [[21.0, 0.25]] * 4, np.float32)
    signed = learner_given_a_rollout(rewards, sign_rewards=None, env_id="ALE/Pong-v5")  # on by default for ALE/*
    assert signed.rewards.dtype == np.float32
    np.testing.assert_array_equal(signed.rewards, np.sign(rewards))
    kept = learner_given_a_rollout(rewards, sign_rewards=None, env_id="CartPole-v1")  # off elsewhere
    np.testing.assert_array_equal(kept.rewards, rewards)
    forced = learner_given_a_rollout(rewards, sign_rewards=True, env_id="CartPole-v1")
    np.testing.assert_array_equal(forced.rewards, np.sign(rewards))
