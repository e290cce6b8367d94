"""Observations beyond a flat float vector: an image-shaped uint8 Box and a Discrete observation
keep their dtype from the env through the collector, the wire and the replay, and become float
features only inside the networks (the actors' NumPy and the learners' torch alike)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pixel_bandit
import pytest
import torch

from rlmq.actors.collector import Collector
from rlmq.common import envs, wire
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec, layout_problem, obs_features, rollout_layout
from rlmq.learners.networks import ActorCritic
from rlmq.learners.networks import obs_features as torch_obs_features
from rlmq.learners.replay import Replay
from tests.helpers.references import to_numpy_params

PIXELS = "pixel_bandit:PixelBandit"  # tests/helpers is on the path (conftest.py)
STEPS, SLOTS = 12, 3


@pytest.mark.parametrize(
    ("env_id", "shape", "dtype", "categories"),
    [
        (PIXELS, (6, 6, 2), "uint8", 0),
        ("FrozenLake-v1", (), "int64", 16),
    ],
)
def test_observations_keep_their_dtype_through_collector_wire_and_replay(
    env_id: str, shape: tuple[int, ...], dtype: str, categories: int
) -> None:
    env = envs.make_vector_env(env_id, SLOTS)
    spec = envs.describe(env, env_id)
    assert (spec.obs_shape, spec.obs_dtype, spec.obs_categories) == (shape, dtype, categories)
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    rollout = Collector(env, spec, STEPS, seed=1).collect(policy, member=0, version=0, actor="a")
    env.close()
    assert rollout.obs.dtype == np.dtype(dtype) and rollout.obs.shape == (STEPS + 1, SLOTS, *shape)
    assert len(np.unique(rollout.obs)) > 1  # the env's observations, not an empty buffer

    decoded = wire.decode(wire.encode(rollout))
    assert isinstance(decoded, wire.Rollout)
    assert decoded.obs.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(decoded.obs, rollout.obs)
    arrays = {name: getattr(decoded, name) for name in rollout_layout(spec, STEPS, SLOTS)}
    assert layout_problem(arrays, spec, STEPS, SLOTS) is None  # what the learner checks

    replay = Replay(1, 1000, spec)
    stored = replay.add_rollout(0, decoded)
    assert stored == int(decoded.valid.sum()) > 0
    rows = replay.frames._rows  # no frame stack: one row per observation, stored as it came
    assert rows.dtype == np.dtype(dtype) and rows.shape[2:] == shape
    batch, _ = replay.sample(64, np.random.default_rng(0))
    assert batch.obs.dtype == torch.float32 and batch.obs.shape == (1, 64, spec.obs_size)
    # Every sampled row is the features of an observation the rollout holds.
    held = {tuple(row) for row in obs_features(decoded.obs[:-1][decoded.valid], spec).tolist()}
    assert {tuple(row) for row in batch.obs[0].tolist()} <= held


def test_discrete_observations_are_one_hot_and_images_flattened_alike_in_numpy_and_torch() -> None:
    discrete = EnvSpec(obs_shape=(), obs_dtype="int64", obs_categories=5, action_kind="discrete", action_dim=3)
    index = np.array([0, 4, 2])
    np.testing.assert_array_equal(obs_features(index, discrete), np.eye(5, dtype=np.float32)[[0, 4, 2]])
    np.testing.assert_array_equal(
        torch_obs_features(torch.from_numpy(index), discrete).numpy(), obs_features(index, discrete)
    )
    image = EnvSpec(obs_shape=(6, 6, 2), obs_dtype="uint8", action_kind="discrete", action_dim=2)
    pixels = np.random.default_rng(0).integers(0, 256, (4, 6, 6, 2), dtype=np.uint8)
    expected = pixels.reshape(4, 72).astype(np.float32)
    np.testing.assert_array_equal(obs_features(pixels, image), expected)
    # With leading [P, T] dimensions, as PPO's batch has them.
    np.testing.assert_array_equal(
        torch_obs_features(torch.from_numpy(pixels).view(2, 2, 6, 6, 2), image).numpy(), expected.reshape(2, 2, 72)
    )


@pytest.mark.parametrize(
    "spec",
    [
        EnvSpec(obs_shape=(), obs_dtype="int64", obs_categories=5, action_kind="discrete", action_dim=3),
        EnvSpec(obs_shape=(6, 6, 2), obs_dtype="uint8", action_kind="discrete", action_dim=2),
    ],
)
def test_actor_policy_and_learner_network_agree_on_any_observation(spec: EnvSpec) -> None:
    net = ActorCritic(spec, (16,))
    rng = np.random.default_rng(3)
    obs = rng.integers(0, spec.obs_categories or 256, (7, *spec.obs_shape)).astype(spec.obs_dtype)
    logits = net.policy(torch_obs_features(torch.from_numpy(obs), spec)).detach().numpy()
    np.testing.assert_allclose(NumpyPolicy(to_numpy_params(net), spec).forward(obs), logits, rtol=1e-5, atol=1e-5)


def test_the_learner_refuses_observations_that_do_not_fit_its_env() -> None:
    spec = EnvSpec(obs_shape=(), obs_dtype="int64", obs_categories=4, action_kind="discrete", action_dim=2)
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in rollout_layout(spec, STEPS, SLOTS).items()}
    assert layout_problem(arrays, spec, STEPS, SLOTS) is None
    arrays["obs"][3, 1] = 4  # one past the last category: one_hot would raise inside the update
    assert layout_problem(arrays, spec, STEPS, SLOTS) == ("bad_value", "a Discrete observation out of range")
    arrays["obs"] = arrays["obs"].astype(np.float32)  # the right shape in the wrong dtype
    reason, detail = layout_problem(arrays, spec, STEPS, SLOTS) or ("", "")
    assert reason == "bad_shape" and "obs is float32" in detail


@pytest.mark.parametrize(
    ("name", "value", "detail"),
    [
        ("obs", -1, "a Discrete observation out of range"),  # read unsigned, -1 is the largest index
        ("obs", -(2**63), "a Discrete observation out of range"),
        ("actions", -1, "an action index out of range"),
        ("actions", 2, "an action index out of range"),
    ],
)
def test_the_learner_refuses_an_index_below_zero_or_past_the_last(name: str, value: int, detail: str) -> None:
    spec = EnvSpec(obs_shape=(), obs_dtype="int64", obs_categories=4, action_kind="discrete", action_dim=2)
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in rollout_layout(spec, STEPS, SLOTS).items()}
    arrays["obs"][:] = 3  # the last category
    arrays["actions"][:] = 1  # the last action
    assert layout_problem(arrays, spec, STEPS, SLOTS) is None
    arrays[name][STEPS - 1, SLOTS - 1] = value
    assert layout_problem(arrays, spec, STEPS, SLOTS) == ("bad_value", detail)


@pytest.mark.parametrize(
    "fields",
    [
        {"obs_shape": (0,)},
        {"obs_shape": (1, 1, 1, 1, 1)},
        {"obs_dtype": "float64"},
        {"obs_shape": (4,), "obs_categories": 3},
        {"obs_shape": ()},
    ],
)
def test_env_specs_that_no_network_could_take_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EnvSpec(**{"obs_shape": (4,), "action_kind": "discrete", "action_dim": 2, **fields})  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_third_party_env_with_uint8_image_observations_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlmq up --env package.module:EnvClass` with a (6, 6, 2) uint8 Box: the policy learns to read
    the image (a random one earns 8 of 16)."""
    monkeypatch.setenv("PYTHONPATH", str(Path(pixel_bandit.__file__).parent))
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--run-dir",
            str(tmp_path),
            "--env",
            PIXELS,
            "--algo",
            "ppo",
            "--actors",
            "2",
            "--learners",
            "1",
            "--target-return",
            "14",
            "--total-steps",
            "60000",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["success"], summary
