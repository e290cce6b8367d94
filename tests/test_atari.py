"""Atari's two env paths and the actor's new acting path: the native vector env (ale-py's C++
threads) against the wrapper path's conventions, its lanes stepped in halves against one env of all
the slots, and a policy acting on a torch device against the reference policy."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlmq.actors.collector import Collector
from rlmq.common import atari, envs
from rlmq.common.config import RunConfig
from rlmq.common.models import EpsilonGreedyPolicy, NumpyPolicy, acting_device, make_policy
from rlmq.common.schema import EnvSpec
from rlmq.common.service import cores_given
from rlmq.learners import minibatching
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

PONG = "ALE/Pong-v5"


class ByPixels:
    """A policy whose action is a function of the observation alone (no random draws), so that
    two ways of stepping the same slots must give the same rollouts."""

    noise_color = 0.0
    state_size = 0  # no recurrent core

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        actions = obs.reshape(len(obs), -1)[:, ::97].sum(axis=1, dtype=np.int64) % 6
        return actions, np.zeros(len(obs), np.float32)


def short_episodes(env_id: str, frames: int) -> gym.envs.registration.EnvSpec:
    spec = gym.spec(env_id)
    return dataclasses.replace(spec, kwargs={**spec.kwargs, "max_num_frames_per_episode": frames})


def test_both_paths_describe_the_same_env_from_one_declaration() -> None:
    """Spaces, dtype and frame stack alike; the sticky actions the id registers (0.25 for v5, none
    for NoFrameskip-v4) reach both emulators."""
    native, wrapped = envs.make_vector_env(PONG, 3), envs.make_vector_env(PONG, 3, native=False)
    assert atari.is_native(native) and not atari.is_native(wrapped)
    spec = envs.describe(native, PONG)
    assert (
        spec
        == envs.describe(wrapped, PONG)
        == EnvSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", frame_stack=4, action_kind="discrete", action_dim=6)
    )
    obs = native.reset(seed=0)[0]
    assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
    assert wrapped.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    for env_id, sticky in ((PONG, 0.25), ("PongNoFrameskip-v4", 0.0)):
        assert atari.native_settings(gym.spec(env_id))["repeat_action_probability"] == sticky
    native.close()
    wrapped.close()


def test_both_paths_reset_with_up_to_30_noops() -> None:
    """Each path by its library's rule (ale-py draws 0–29 no-ops, gymnasium's wrapper 1–30), one
    frame each, different in different slots; the native env answers in slot order."""
    for native, fewest, most in ((True, 0, 29), (False, 1, 30)):
        env = envs.make_vector_env(PONG, 8, native=native)
        _, info = env.reset(seed=1)
        frames = info["episode_frame_number"]
        assert ((fewest <= frames) & (frames <= most)).all() and len(set(frames.tolist())) >= 3, (native, frames)
        if native:
            assert np.array_equal(env.step(np.zeros(8, np.int64))[4]["env_id"], np.arange(8))
        env.close()


@pytest.mark.parametrize("native", [True, False])
def test_an_episode_truncated_by_its_frame_limit_then_a_reset_step(native: bool) -> None:
    """Both paths end an episode at the id's frame limit (here 400 frames: 100 steps of 4, less the
    no-ops) as truncated, and next-step autoreset spends one step resetting: not valid, reward 0."""
    spec = short_episodes(PONG, 400)
    env = (
        atari.native_env(spec, 2, threads=1)
        if native
        else gym.make_vec(spec, num_envs=2, vectorization_mode="sync", frameskip=1, wrappers=atari.wrappers())
    )
    rollout = Collector(env, envs.describe(env, PONG), 120, seed=3).collect(ByPixels(), 0, 0, "a")
    env.close()
    for slot in range(2):
        ends = np.flatnonzero(rollout.truncated[:, slot])
        assert len(ends) == 1 and not rollout.terminated[:, slot].any()
        assert 92 <= ends[0] + 1 <= 100  # steps in the episode
        assert not rollout.valid[ends[0] + 1, slot] and rollout.rewards[ends[0] + 1, slot] == 0
        assert rollout.valid[: ends[0] + 1, slot].all() and rollout.valid[ends[0] + 2 :, slot].all()


def test_native_env_reports_rewards_unclipped_and_the_learners_clip_them() -> None:
    """Space Invaders scores 5 to 30 a hit: the actor's rollouts and episode returns keep them."""
    env_id = "ALE/SpaceInvaders-v5"
    env = atari.native_env(short_episodes(env_id, 1200), 4, threads=1)
    collector = Collector(env, envs.describe(env, env_id), 150, seed=0)
    rollouts = [collector.collect(ByPixels(), 0, 0, "a") for _ in range(3)]
    env.close()
    rewards = np.concatenate([r.rewards for r in rollouts])
    assert rewards.max() >= 5
    returns, _, _ = collector.finished_episodes()
    assert len(returns) >= 4 and returns.max() >= 5
    assert RunConfig(env_id=env_id).signs_rewards


def test_an_actor_splits_a_native_env_into_two_lanes_and_nothing_else() -> None:
    lanes = envs.make_lanes(PONG, 5, threads=3)
    assert [(lane.num_envs, atari.is_native(lane)) for lane in lanes] == [(2, True), (3, True)]
    unsplit, cartpole = envs.make_lanes(PONG, 4, threads=2, split=False), envs.make_lanes("CartPole-v1", 4, threads=2)
    assert [lane.num_envs for lane in unsplit] == [4] and [lane.num_envs for lane in cartpole] == [4]
    for lane in lanes + unsplit + cartpole:
        lane.close()


def test_two_lanes_stepped_in_halves_collect_what_one_env_of_all_slots_does() -> None:
    """The actor's pipelined lanes (one lane's emulators run while the next lane's actions are
    chosen) against one native env of the four slots: the same rollouts, step for step, through
    episodes that end (at 400 frames) and the reset steps after them."""
    short = short_episodes(PONG, 400)
    spec = envs.probe(PONG)
    got = Collector([atari.native_env(short, 2, threads=1) for _ in range(2)], spec, 70, seed=7)
    want = Collector(atari.native_env(short, 4, threads=1), spec, 70, seed=7)
    for _ in range(2):
        a, b = got.collect(ByPixels(), 0, 0, "a"), want.collect(ByPixels(), 0, 0, "a")
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "valid"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.truncated.any() and not a.valid.all()  # the second rollout holds ends and resets
    acting_s, env_wait_s = got.take_times()
    assert acting_s > 0 and env_wait_s > 0 and got.take_times() == (0.0, 0.0)
    got.close()
    want.close()


def nature_params(spec: EnvSpec, seed: int, normalize: bool = False) -> dict[str, np.ndarray]:
    torch.manual_seed(seed)
    params = to_numpy_params(ActorCritic(spec, (32,), encoder="nature", activation="relu"))
    if normalize:  # statistics that move each feature, as a run with normalize_obs publishes them
        rng = np.random.default_rng(seed)
        params |= {
            "obs_norm.mean": rng.uniform(0, 80, spec.obs_size).astype(np.float32),
            "obs_norm.var": rng.uniform(100, 900, spec.obs_size).astype(np.float32),
            "obs_norm.count": np.array(10.0, np.float32),
            "obs_norm.clip": np.array(5.0, np.float32),
        }
    return params


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
def test_acting_on_a_device_chooses_the_reference_policys_actions(device: str, normalize: bool) -> None:
    """The whole forward on a torch device (a GPU on a GPU host; the same code on the CPU here)
    against the CPU path the actors use without one: the same outputs, and for the same random
    state the same sampled actions, ε-greedy ones included."""
    spec = envs.probe(PONG)
    params = nature_params(spec, 0, normalize)
    obs = envs.make_vector_env(PONG, 16).reset(seed=2)[0]
    obs[8:] = np.random.default_rng(3).integers(0, 256, obs[8:].shape, dtype=np.uint8)  # pixels far apart
    reference = NumpyPolicy(params, spec, encoder="nature", activation="relu")
    on_device = NumpyPolicy(params, spec, encoder="nature", activation="relu", device=device)
    np.testing.assert_allclose(on_device.forward(obs), reference.forward(obs), rtol=1e-4, atol=1e-4)
    for seed in (5, 6, 7):
        want, got = reference.act(obs, np.random.default_rng(seed)), on_device.act(obs, np.random.default_rng(seed))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)
    greedy = [EpsilonGreedyPolicy(params, spec, 0.3, "nature", device=d) for d in (None, device)]
    want_q, got_q = (p.act(obs, np.random.default_rng(6))[0] for p in greedy)
    np.testing.assert_array_equal(got_q, want_q)


@pytest.mark.parametrize("device", DEVICES)
def test_a_recurrent_policy_without_frame_stacks_encodes_on_a_device_and_remembers_on_the_host(device: str) -> None:
    """`frame_stack = 1` (CleanRL's ppo_atari_lstm): one frame per observation on both env paths,
    and a policy with an LSTM encodes on the device while its core steps the slots' states in
    NumPy, as the CPU path does: the same outputs and states, step after step."""
    spec = envs.probe(PONG, "ppo", frame_stack=1)
    assert (spec.obs_shape, spec.frame_stack) == ((1, 84, 84), 1)
    wrapped = envs.make_vector_env(PONG, 1, native=False, frame_stack=1)
    assert wrapped.single_observation_space.shape == (1, 84, 84)
    wrapped.close()
    torch.manual_seed(0)
    network = ActorCritic(spec, (32,), encoder="nature", activation="relu", core="lstm", core_size=16)
    params = to_numpy_params(network)
    reference = NumpyPolicy(params, spec, encoder="nature", activation="relu")
    on_device = NumpyPolicy(params, spec, encoder="nature", activation="relu", device=device)
    assert on_device.state_size == reference.state_size == 32
    env = envs.make_vector_env(PONG, 4, frame_stack=1)
    obs = env.reset(seed=1)[0]
    want_state, got_state = np.zeros((4, 32), np.float32), np.zeros((4, 32), np.float32)
    for _ in range(5):
        want = reference.forward(obs, want_state)
        np.testing.assert_allclose(on_device.forward(obs, got_state), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_state, want_state, rtol=1e-4, atol=1e-4)
        obs = env.step(want.argmax(1))[0]
    env.close()


def test_frame_stack_is_an_ale_ids_and_at_least_one() -> None:
    """Only an ALE id's preprocessing stacks frames: another env asked to is refused, naming what to
    do, and so is a run that asks for none."""
    assert envs.probe("CartPole-v1", frame_stack=1).obs_shape == (4,)
    with pytest.raises(envs.EnvError, match="only ALE ids' preprocessing stacks frames"):
        envs.probe("CartPole-v1", frame_stack=4)
    with pytest.raises(ValueError, match="frame_stack must be at least 1"):
        RunConfig(env_id=PONG, frame_stack=0)


def test_each_rollout_is_collected_by_the_version_it_names() -> None:
    """Weights change between rollouts: each rollout's log-probabilities are those of the policy
    whose version it carries (recomputed from that version's weights), not the other's."""
    spec = envs.probe(PONG)
    run = RunConfig(env_id=PONG, hidden_sizes=(32,), ppo=dataclasses.replace(RunConfig().ppo, activation="relu"))
    versions = {v: make_policy(run, nature_params(spec, v), spec, device="cpu") for v in (1, 2)}
    collector = Collector(envs.make_lanes(PONG, 4, threads=2), spec, 6, seed=0)
    rollouts = [collector.collect(versions[v], 0, v, "a") for v in (1, 2, 1)]
    collector.close()
    for rollout in rollouts:
        for version, policy in versions.items():
            logits = policy.forward(rollout.obs[:-1].reshape(-1, *spec.obs_shape))
            logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
            taken = np.take_along_axis(logp, rollout.actions.reshape(-1, 1), axis=1).reshape(rollout.actions.shape)
            assert np.allclose(taken, rollout.logprobs, atol=1e-4) == (version == rollout.policy_version)


def test_a_host_without_a_gpu_acts_on_the_cpu_path() -> None:
    """ "auto" falls back to today's path where torch sees no GPU (and MLPs never ask torch); a GPU
    asked for and not there stops `rlmq up` before anything starts, naming the fix."""
    assert acting_device("cpu", "nature") is None and acting_device("auto", "minatar") is None
    if torch.cuda.is_available():
        assert acting_device("auto", "nature", index=3) == f"cuda:{3 % torch.cuda.device_count()}"
        return
    assert acting_device("auto", "nature") is None
    with pytest.raises(ValueError, match="use auto .* or cpu"):
        acting_device("cuda", "nature")
    argv = ["up", "--env", PONG, "--algo", "ppo", "--actors", "1", "--actor-device", "cuda", "--total-steps", "1000"]
    up = subprocess.run([sys.executable, "-m", "rlmq.cli", *argv], capture_output=True, text=True, timeout=120)
    assert up.returncode == 2 and "torch sees 0 GPU(s) here; use auto" in up.stderr, up.stderr
    probe = (
        "import sys; from rlmq.common.models import acting_device; "
        "print(acting_device('auto', 'mlp'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["None", "False"]


def test_the_cores_given_are_those_the_cgroup_quota_allows(tmp_path: Path) -> None:
    """What an actor's env threads default to (`ActorConfig.env_threads` 0): the cores it may run
    on, fewer under its container's CPU quota, in whole cores (a pod's limit of 2.5 CPUs gives 2
    threads, of 0.5 one)."""
    cores = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    for text, want in (
        ("max 100000", cores),
        ("250000 100000", min(cores, 2)),
        ("50000 100000", 1),
        ("garbage", cores),
    ):
        quota.write_text(text + "\n")
        assert cores_given(str(quota)) == want, text
    assert cores_given(str(tmp_path / "absent")) == cores


def test_the_gpu_pong_candidate_config_loads_and_fits_pong() -> None:
    """benchmarks/ppo-pong-gpu.toml, which benchmarks/gpu_checks.sh runs: the Nature CNN on Pong,
    and a batch of its 4 actors' rollouts cut into √4 × 4 minibatches."""
    from rlmq.common.loading import load_run_config

    run = load_run_config(Path(__file__).parents[1] / "benchmarks" / "ppo-pong-gpu.toml", {})
    assert run.encoder_for(envs.probe(run.env_id, run.algo)) == "nature"
    assert minibatching.for_batch(run.ppo, 4).minibatches == 8 and run.num_envs % 2 == 0
