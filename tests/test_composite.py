"""Dict and Tuple observations (common/composite.py): one record of the parts' bytes per step
through the collector, the wire and the replay, read back into features alike by the actors'
NumPy and the learners' torch, an image part through the encoder and the rest past it; and a Dict
env of an image and a vector learned through `rlmq up` by PPO and by DQN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pixel_bandit
import pytest
import torch

from rlmq.actors.collector import Collector
from rlmq.common import envs, wire
from rlmq.common.composite import pack, plan_parts
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec, ObsPart, obs_features
from rlmq.learners.dqn import QNetwork
from rlmq.learners.networks import ActorCritic
from rlmq.learners.networks import obs_features as torch_obs_features
from rlmq.learners.replay import Replay
from tests.helpers.references import to_numpy_params

DICT = "pixel_bandit:DictBandit"  # tests/helpers is on the path (conftest.py)
IMAGE, VECTOR = ObsPart("image", (6, 6, 2), "uint8"), ObsPart("vector", (2,), "float32")
SPEC = EnvSpec(obs_shape=(80,), obs_dtype="uint8", obs_parts=(IMAGE, VECTOR), action_kind="discrete", action_dim=4)


def observations(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (rows, 6, 6, 2), dtype=np.uint8),
        "vector": rng.normal(size=(rows, 2)).astype(np.float32),
    }


def test_a_dict_observation_is_one_record_of_its_parts_bytes_from_env_to_replay() -> None:
    env = envs.make_vector_env(DICT, 3)
    spec = envs.describe(env, DICT)
    assert spec == SPEC
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    rollout = Collector(env, spec, 12, seed=1).collect(policy, member=0, version=0, actor="a")
    env.close()
    assert rollout.obs.dtype == np.uint8 and rollout.obs.shape == (13, 3, 80)
    decoded = wire.decode(wire.encode(rollout))
    assert isinstance(decoded, wire.Rollout)
    np.testing.assert_array_equal(decoded.obs, rollout.obs)
    # the image's bytes are the first 72 of each record, as the env drew them: lit columns are 255
    images = decoded.obs[..., :72].reshape(13, 3, 6, 6, 2)
    assert set(np.unique(images[..., 0])) == {0, 255}
    replay = Replay(1, 1000, spec)
    assert replay.add_rollout(0, decoded) > 0
    assert replay.frames._rows.dtype == np.uint8 and replay.frames._rows.shape[2:] == (80,)


def test_the_parts_read_back_into_the_same_features_in_numpy_and_torch() -> None:
    obs = observations(5)
    record = pack(obs, SPEC.obs_parts, 5)
    expected = np.concatenate([obs["image"].reshape(5, 72).astype(np.float32), obs["vector"]], axis=1)
    np.testing.assert_array_equal(obs_features(record, SPEC), expected)
    batched = torch_obs_features(torch.from_numpy(record).view(1, 5, 80), SPEC)  # [P, N, ...] as a batch holds it
    np.testing.assert_array_equal(batched[0].numpy(), expected)
    np.testing.assert_array_equal(pack({k: v[2] for k, v in obs.items()}, SPEC.obs_parts, None), record[2])


@pytest.mark.parametrize("encoder", ["mlp", "minatar"])
def test_actor_policy_and_learner_networks_agree_on_a_dict_observation(encoder: str) -> None:
    """The image part through the encoder, the vector beside its output (or all flattened)."""
    record = pack(observations(7, seed=3), SPEC.obs_parts, 7)
    features = torch_obs_features(torch.from_numpy(record), SPEC)
    net = ActorCritic(SPEC, (16,), encoder=encoder)
    logits = net.policy(net.features(features)).detach().numpy()
    actor = NumpyPolicy(to_numpy_params(net), SPEC, encoder=encoder)
    np.testing.assert_allclose(actor.forward(record), logits, rtol=1e-5, atol=1e-5)
    q = QNetwork(SPEC, (16,), encoder)
    assert q(features).shape == (7, 4)


def test_tuple_parts_are_named_by_position_and_other_parts_are_refused_naming_the_fix() -> None:
    space = gym.spaces.Tuple((gym.spaces.Box(0, 1, (3,), np.float64), gym.spaces.Box(0, 255, (4, 4, 1), np.uint8)))
    assert plan_parts(space, "T") == (ObsPart("1", (4, 4, 1), "uint8"), ObsPart("0", (3,), "float32"))
    nested = gym.spaces.Dict({"x": gym.spaces.Box(0, 1, (2,)), "mode": gym.spaces.Discrete(3)})
    with pytest.raises(ValueError, match="'mode'.*FlattenObservation"):
        plan_parts(nested, "D")


DQN_CONFIG = """
algo = "dqn"
total_steps = 30_000
[dqn]
hidden_sizes = [64]
learning_starts = 500
exploration_fraction = 0.2
exploration_final_eps = 0.02
"""


REGISTERED = "pixel_bandit:PixelBandit/Dict-v0"  # Gymnasium's `module:EnvId`: the import registers it


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_dict_env_of_an_image_and_a_vector_registered_on_import_is_learned(tmp_path: Path, algo: str) -> None:
    """A random policy earns 4 of 16, one that reads the image alone 8: 12 needs both parts. The env
    is named as Gymnasium's own `make` reads a third-party id: the module's import registers it."""
    config = tmp_path / "run.toml"
    config.write_text(DQN_CONFIG if algo == "dqn" else 'algo = "ppo"\ntotal_steps = 60_000\n')
    done = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "up", "--run-dir", str(tmp_path / "run"), "--actors", "2"]
        + ["--config", str(config), "--env", REGISTERED, "--target-return", "12"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(Path(pixel_bandit.__file__).parent)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["success"] and summary["evaluation"]["mean_return"] >= 12, summary
