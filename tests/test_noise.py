"""Colored exploration noise: its spectrum and variance, each slot's sequence running on across
steps and weight updates and starting afresh at the slot's episode end, and the actors' SAC and TD3
policies drawing from it in a real env."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlmq.actors.collector import Collector
from rlmq.cli.evaluate import Checkpoint, evaluate
from rlmq.common import envs
from rlmq.common.algorithms import SACConfig, TD3Config
from rlmq.common.config import RunConfig
from rlmq.common.episodes import Sampler, play
from rlmq.common.models import DeterministicPolicy, SquashedGaussianPolicy, make_policy
from rlmq.common.noise import DEFAULT_HORIZON, MAX_HORIZON, ColoredNoise, horizon_for, powerlaw_noise
from rlmq.common.schema import EnvSpec
from rlmq.learners import sac, td3


def lag_correlation(x: np.ndarray, lag: int) -> float:
    """Correlation of x[..., t] with x[..., t + lag], over all sequences and times."""
    return float(np.mean(x[..., lag:] * x[..., :-lag]) / np.mean(x * x))


@pytest.mark.parametrize("beta", [0.0, 1.0, 2.0])
def test_powerlaw_noise_has_unit_variance_and_a_1_over_f_beta_spectrum(beta: float) -> None:
    x = powerlaw_noise(beta, (4000, 512), np.random.default_rng(0))
    assert abs(x.mean()) < 0.05
    np.testing.assert_allclose(x.var(axis=0).mean(), 1.0, atol=0.03)  # each step's N(0, 1) marginal
    power = (np.abs(np.fft.rfft(x, axis=-1)) ** 2).mean(axis=0)[1:-1]
    freqs = np.fft.rfftfreq(512)[1:-1]
    slope = np.polyfit(np.log(freqs), np.log(power), 1)[0]
    assert slope == pytest.approx(-beta, abs=0.1)


def test_pink_noise_wanders_where_white_noise_does_not() -> None:
    rng = np.random.default_rng(1)
    white, pink = powerlaw_noise(0.0, (500, 1000), rng), powerlaw_noise(1.0, (500, 1000), rng)
    assert abs(lag_correlation(white, 1)) < 0.02
    assert lag_correlation(pink, 1) > 0.6 and lag_correlation(pink, 20) > 0.3

    def runs_below_zero(x: np.ndarray) -> float:  # 20 steps in a row below 0: an engine left off that long
        windows = np.lib.stride_tricks.sliding_window_view(x < 0, 20, axis=-1)
        return float(windows.all(axis=-1).mean())

    assert runs_below_zero(white) < 1e-5  # 2⁻²⁰ each
    assert runs_below_zero(pink) > 0.03


def test_each_slot_runs_on_and_starts_a_new_sequence_at_its_episode_end() -> None:
    noise = ColoredNoise(1.0, slots=3, dims=2, horizon=5, rng=np.random.default_rng(2))
    first = noise.sequences.copy()
    for t in range(3):
        np.testing.assert_array_equal(noise.sample(), first[:, t])
    noise.restart(np.array([False, True, False]))
    draws = noise.sample()
    np.testing.assert_array_equal(draws[[0, 2]], first[[0, 2], 3])  # the others run on
    assert not np.array_equal(noise.sequences[1], first[1])
    np.testing.assert_array_equal(draws[1], noise.sequences[1, 0])  # the ended one starts again
    noise.sample()  # slots 0 and 2 have spent their 5 steps
    renewed = noise.sample()
    np.testing.assert_array_equal(renewed[[0, 2]], noise.sequences[[0, 2], 0])
    assert not np.array_equal(noise.sequences[0], first[0])
    np.testing.assert_array_equal(renewed[1], noise.sequences[1, 2])


def test_a_sequence_spans_the_time_limit_within_bounds() -> None:
    assert horizon_for(200) == 200
    assert horizon_for(None) == DEFAULT_HORIZON
    assert horizon_for(10**8) == MAX_HORIZON  # held whole in memory


def test_bad_noise_colors_are_refused() -> None:
    with pytest.raises(ValueError, match="noise_color"):
        SACConfig(noise_color=-1.0)
    with pytest.raises(ValueError, match="noise_color"):
        TD3Config(noise_color=-0.5)
    with pytest.raises(ValueError, match="beta"):
        ColoredNoise(-1.0, 2, 1, 100, np.random.default_rng(0))


def test_the_sac_policy_acts_with_the_noise_it_is_given_not_the_rngs() -> None:
    spec = envs.probe("Pendulum-v1")
    algo = sac.SAC(spec, SACConfig(hidden_sizes=(16,)), 1, torch.device("cpu"))
    policy = make_policy(
        RunConfig(env_id="Pendulum-v1", algo="sac", sac=SACConfig(noise_color=1.0)), algo.member_params(0), spec
    )
    assert isinstance(policy, SquashedGaussianPolicy) and policy.noise_color == 1.0
    obs = np.random.default_rng(3).standard_normal((8, 3)).astype(np.float32)
    noise = np.random.default_rng(4).standard_normal((8, 1)).astype(np.float32)
    once, _ = policy.act(obs, np.random.default_rng(5), noise)
    again, _ = policy.act(obs, np.random.default_rng(6), noise)  # the rng is not drawn from
    np.testing.assert_array_equal(once, again)
    assert not np.allclose(once, policy.act(obs, np.random.default_rng(5))[0])


def silent_td3(beta: float) -> tuple[EnvSpec, dict[str, np.ndarray], RunConfig]:
    """A TD3 actor for Pendulum whose network outputs 0: it acts with its exploration noise alone,
    0.2 × 2 (Pendulum's bound) × each draw."""
    spec = envs.probe("Pendulum-v1")
    params = td3.TD3(spec, TD3Config(hidden_sizes=(16, 16)), 1, torch.device("cpu")).member_params(0)
    params["policy.4.weight"][:] = 0
    params["policy.4.bias"][:] = 0
    run = RunConfig(
        env_id="Pendulum-v1", algo="td3", td3=TD3Config(exploration_noise=0.2, noise_color=beta, learning_starts=0)
    )
    return spec, params, run


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_collector_gives_a_td3_policy_noise_of_its_color_across_weight_updates(beta: float) -> None:
    """Its actions within an episode of Pendulum are as correlated as the color says, and one
    sequence per slot runs on across a rollout boundary where new weights (a new policy object)
    arrive."""
    spec, params, run = silent_td3(beta)
    env = envs.make_vector_env("Pendulum-v1", 4)
    try:
        collector = Collector(env, spec, rollout_length=60, seed=7)
        halves = []
        for _ in range(2):  # steps 0-59, then 60-119 of one 200-step episode, each under its own policy
            policy = make_policy(run, params, spec, trained_steps=1)
            assert isinstance(policy, DeterministicPolicy) and policy.noise_color == beta
            halves.append(collector.collect(policy, member=0, version=1, actor="a").actions[..., 0])
    finally:
        env.close()
    draws = np.concatenate(halves).T / (0.2 * 2.0)  # [slot, time], in N(0, 1) units (Pendulum's bound: 2)
    correlation = lag_correlation(draws - draws.mean(axis=-1, keepdims=True), 1)
    if beta == 0.0:
        assert collector.noise is None and abs(correlation) < 0.15
    else:
        assert collector.noise is not None and correlation > 0.5
        np.testing.assert_allclose(draws, collector.noise.sequences[:, :120, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_rlmq_evals_sampled_actions_draw_the_noise_of_the_policys_color_a_sequence_per_episode(beta: float) -> None:
    spec, params, run = silent_td3(beta)
    sampler = Sampler(make_policy(run, params, spec, trained_steps=1), spec, np.random.default_rng(0))
    actions: list[np.ndarray] = []

    def act(obs: np.ndarray) -> np.ndarray:
        actions.append(sampler(obs)[0])
        return actions[-1][None]

    played = play("Pendulum-v1", act, episodes=2, seed=0, new_episode=sampler.new_episode)
    draws = np.asarray(actions)[:, 0].reshape(2, 200) / (0.2 * 2.0)  # two 200-step episodes, N(0, 1) units
    correlation = lag_correlation(draws - draws.mean(axis=-1, keepdims=True), 1)
    if beta == 0.0:
        assert sampler.noise is None and abs(correlation) < 0.15
    else:
        assert sampler.noise is not None and sampler.noise.horizon == 200 and correlation > 0.5
        np.testing.assert_allclose(draws[1], sampler.noise.sequences[0, :, 0], rtol=1e-5, atol=1e-6)
        assert not np.allclose(draws[0], draws[1])  # the second episode drew a sequence of its own
    # `rlmq eval --sample` samples so: from the same seed, the same episodes
    checkpoint = Checkpoint(run, spec, member=0, params=params, version=1, trained_steps=1)
    assert evaluate(checkpoint, episodes=2, seed=0, deterministic=False).returns == played.returns
