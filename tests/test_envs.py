"""Environments: registered ids, `package.module:EnvClass`, spaces, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from rlmq.actors.collector import Collector
from rlmq.common import envs
from rlmq.common.models import NumpyPolicy
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

CARTPOLE_CLASS = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
CARTPOLE_VECTOR_CLASS = "gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv"


@pytest.mark.parametrize("env_id", ["CartPole-v1", CARTPOLE_CLASS, CARTPOLE_VECTOR_CLASS, "Pendulum-v1"])
def test_collects_valid_rollouts(env_id: str) -> None:
    env = envs.make_vector_env(env_id, 3)
    spec = envs.describe(env, env_id)
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    collector = Collector(env, spec, rollout_length=40, seed=0)
    rollout = collector.collect(policy, member=0, version=2, actor="a")
    assert rollout.obs.shape == (41, 3, *spec.obs_shape)
    assert rollout.policy_version == 2 and rollout.valid.any()
    done = rollout.terminated | rollout.truncated
    # Next-step autoreset: the step after a done is a reset step, and only that one is invalid.
    assert np.array_equal(rollout.valid[1:], ~done[:-1]) and rollout.valid[0].all()
    assert (rollout.rewards[~rollout.valid] == 0).all()
    env.close()


def test_observations_of_any_box_shape_keep_their_shape_in_the_rollout() -> None:
    """A (2, 2) observation lands as it is, and the networks take it as 4 inputs; replaying the
    rollout's actions in a twin env (same seed) gives the same observations."""
    import gymnasium as gym
    from gymnasium.wrappers import ReshapeObservation

    def make() -> gym.vector.VectorEnv:
        return gym.vector.SyncVectorEnv([lambda: ReshapeObservation(gym.make("CartPole-v1"), (2, 2))] * 3)

    env, twin = make(), make()
    spec = envs.describe(env, "grid-cartpole")
    assert spec.obs_size == 4
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    rollout = Collector(env, spec, rollout_length=30, seed=5).collect(policy, 0, 0, "a")
    assert rollout.obs.shape == (31, 3, 2, 2)
    expected = [twin.reset(seed=5)[0]]
    expected += [twin.step(action)[0] for action in rollout.actions]
    np.testing.assert_array_equal(rollout.obs, np.stack(expected))
    env.close()
    twin.close()


def test_native_vector_entry_point_is_used() -> None:
    env = envs.make_vector_env("CartPole-v1", 4)
    assert type(env).__name__ == "CartPoleVectorEnv"  # ~10x a SyncVectorEnv here
    env.close()


def test_continuous_spec_carries_bounds() -> None:
    spec = envs.probe("Pendulum-v1")
    assert (spec.action_kind, spec.obs_size, spec.action_dim) == ("continuous", 3, 1)
    assert spec.action_low == (-2.0,) and spec.action_high == (2.0,)


@pytest.mark.parametrize(
    "env_id, words",
    [
        ("NoSuchEnv-v9", "unknown env"),
        ("no_such_module_xyz:Env", "cannot import"),
        ("Blackjack-v1", "not a Box"),
    ],
)
def test_unsupported_envs_fail_clearly(env_id: str, words: str) -> None:
    with pytest.raises(envs.EnvError, match=words):
        envs.probe(env_id)


def test_episode_bookkeeping_across_rollouts() -> None:
    """Episodes spanning rollouts are summed whole, and every valid step lands in exactly one
    episode, unless the lineage changed before it ended: then it is abandoned, not reported."""
    env = envs.make_vector_env("CartPole-v1", 5)
    spec = envs.describe(env, "CartPole-v1")
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    collector = Collector(env, spec, rollout_length=7, seed=3)  # shorter than most episodes
    rollouts, parts, lineage_of = [], [], []
    for count in (13, 1, 26):  # reports between rollouts: episodes open at a report carry over
        for _ in range(count):  # the weights' lineage changes every 8 rollouts (a PBT copy, a generation)
            lineage_of.append(len(rollouts) // 8)
            rollouts.append(collector.collect(policy, 0, 0, "a", lineage=lineage_of[-1]))
        parts.append(collector.finished_episodes())
    returns, lengths, lineages = (np.concatenate(p) for p in zip(*parts, strict=True))
    # Reference: walk the steps one by one; an episode's lineage is its first step's rollout's, and
    # a change of lineage abandons every open episode.
    running, expected, started, begun = np.zeros(5), [], np.ones(5, bool), np.zeros(5, int)
    abandoned = 0.0  # steps of abandoned episodes (CartPole's reward is 1 a step)
    for i, r in enumerate(rollouts):
        if i and lineage_of[i] != lineage_of[i - 1]:
            abandoned += running.sum()
            running[:], started[:] = 0, True
            # The envs were reset: step 0 is a fresh CartPole state, and a real step.
            assert r.valid[0].all() and (np.abs(r.obs[0]) <= 0.05).all()
        for t in range(r.rewards.shape[0]):
            begun[started], started[:] = lineage_of[i], False
            running += r.rewards[t]
            for slot in np.flatnonzero(r.terminated[t] | r.truncated[t]):
                expected.append((running[slot], begun[slot]))
                running[slot], started[slot] = 0, True
    assert len(returns) > 20 and len(set(lineages.tolist())) > 3
    assert sorted(zip(returns.tolist(), lineages.tolist(), strict=True)) == sorted(expected)
    assert np.array_equal(returns, lengths)  # CartPole: reward 1 for every real step
    # Independent of the collector's own bookkeeping: what an invalid step returns is a freshly
    # reset CartPole state (every coordinate drawn from ±0.05), and its reward is 0.
    for r in rollouts:
        resets = r.obs[1:][~r.valid]
        assert (np.abs(resets) <= 0.05).all() and (r.rewards[~r.valid] == 0).all()
    assert any((~r.valid).any() for r in rollouts)
    valid_steps = sum(int(r.valid.sum()) for r in rollouts)
    assert lengths.sum() + collector.episode_length.sum() + abandoned == valid_steps
    env.close()


@pytest.mark.parametrize(
    ("masked", "full", "hidden"),
    [("CartPoleNoVel-v1", "CartPole-v1", [1, 3]), ("PendulumNoVel-v1", "Pendulum-v1", [2])],
)
def test_the_no_velocity_envs_are_their_envs_with_the_velocities_zeroed(
    masked: str, full: str, hidden: list[int]
) -> None:
    """Same seed, same actions: the masked env's observations are the full env's with the
    velocity entries zeroed, step for step and across resets (CartPole's native vector env too)."""
    pair = [envs.make_vector_env(env_id, 3) for env_id in (masked, full)]
    obs = [env.reset(seed=7)[0] for env in pair]
    rng = np.random.default_rng(0)
    for _ in range(300):  # CartPole's episodes end and reset within this
        expected = obs[1].copy()
        expected[:, hidden] = 0
        np.testing.assert_array_equal(obs[0], expected)
        assert np.abs(obs[1][:, hidden]).max() > 0
        actions = rng.integers(0, 2, 3) if full == "CartPole-v1" else rng.uniform(-2, 2, (3, 1)).astype(np.float32)
        obs = [env.step(actions)[0] for env in pair]
    assert envs.describe(pair[0], masked) == envs.describe(pair[1], full)
    for env in pair:
        env.close()
