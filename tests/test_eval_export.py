"""`rlmq eval` and `rlmq export` on a checkpoint a short `rlmq up` run wrote; the exported file, run
in a fresh process that never imports rlmq, acts as the learner's policy does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlmq.cli.evaluate import Checkpoint, load_checkpoint, policy_of
from rlmq.cli.export import export
from rlmq.common.composite import pack
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec, ObsPart
from rlmq.learners.dqn import QNetwork
from rlmq.learners.networks import ActorCritic
from rlmq.learners.sac import Actor as SACActor
from rlmq.learners.td3 import Actor as TD3Actor
from tests.helpers.references import to_numpy_params

CONTINUOUS = EnvSpec(
    obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
)
DISCRETE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3)
IMAGE = EnvSpec(obs_shape=(6, 6, 2), obs_dtype="uint8", action_kind="discrete", action_dim=2)
DICT = EnvSpec(
    obs_shape=(80,),
    obs_dtype="uint8",
    obs_parts=(ObsPart("image", (6, 6, 2), "uint8"), ObsPart("vector", (2,), "float32")),
    action_kind="discrete",
    action_dim=4,
)
GOAL = EnvSpec(  # Gymnasium-Robotics' PointMaze: a goal-conditioned Dict observation
    obs_shape=(32,),
    obs_dtype="uint8",
    obs_parts=(ObsPart("achieved_goal", (2,), "float32"), ObsPart("desired_goal", (2,), "float32"))
    + (ObsPart("observation", (4,), "float32"),),
    action_kind="continuous",
    action_dim=2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
)
ONE_HOT = EnvSpec(obs_shape=(), obs_dtype="int64", obs_categories=7, action_kind="discrete", action_dim=4)

# Runs in a fresh interpreter: loads the exported file with plain torch and prints its actions.
PLAIN_TORCH = """
import json, sys
import numpy as np, torch
policy = torch.jit.load(sys.argv[1])
obs = torch.from_numpy(np.load(sys.argv[2]))
actions = policy(obs).numpy()
assert not [m for m in sys.modules if m.split(".")[0] == "rlmq"], "imported rlmq"
print(json.dumps(actions.tolist()))
"""


def run_plain_torch(model: Path, obs: np.ndarray, tmp_path: Path) -> np.ndarray:
    np.save(tmp_path / "obs.npy", obs)
    out = subprocess.run(
        [sys.executable, "-I", "-c", PLAIN_TORCH, str(model), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return np.asarray(json.loads(out.stdout))


def checkpoint(algo: str, spec: EnvSpec, params: dict[str, np.ndarray], **stats: np.ndarray) -> Checkpoint:
    return Checkpoint(
        run_config=RunConfig(algo=algo, normalize_obs=bool(stats)),
        spec=spec,
        member=0,
        params={**params, **stats},
        version=1,
        trained_steps=0,
    )


STATS = {
    "obs_norm.mean": np.array([0.5, -1.0, 2.0], np.float32),
    "obs_norm.var": np.array([4.0, 0.25, 9.0], np.float32),
    "obs_norm.count": np.array(100.0, np.float32),
    "obs_norm.clip": np.array(1.5, np.float32),
}


@pytest.mark.parametrize(
    ("algo", "spec", "params", "stats"),
    [
        ("ppo", DISCRETE, lambda: to_numpy_params(ActorCritic(DISCRETE, (16,))), {}),
        ("ppo", CONTINUOUS, lambda: to_numpy_params(ActorCritic(CONTINUOUS, (16,))), STATS),
        ("sac", CONTINUOUS, lambda: to_numpy_params(SACActor(CONTINUOUS, (16, 16))), STATS),
        ("td3", CONTINUOUS, lambda: to_numpy_params(TD3Actor(CONTINUOUS, (16,))), {}),
        ("dqn", IMAGE, lambda: to_numpy_params(QNetwork(IMAGE, (16,), "minatar")), {}),  # a CNN: "auto" picks it
        ("dqn", ONE_HOT, lambda: to_numpy_params(QNetwork(ONE_HOT, (16,))), {}),
        ("ppo", DICT, lambda: to_numpy_params(ActorCritic(DICT, (16,), encoder="minatar")), {}),  # image + vector
        ("sac", GOAL, lambda: to_numpy_params(SACActor(GOAL, (16, 16))), {}),
        ("td3", GOAL, lambda: to_numpy_params(TD3Actor(GOAL, (16,))), {}),
    ],
)
def test_the_exported_policy_acts_as_the_deterministic_numpy_policy(
    tmp_path: Path, algo: str, spec: EnvSpec, params: object, stats: dict[str, np.ndarray]
) -> None:
    rng = np.random.default_rng(1)
    parts = {  # a composite observation as the env gives it
        p.name: rng.integers(0, 256, (64, *p.shape)).astype(np.uint8)
        if p.dtype == "uint8"
        else rng.standard_normal((64, *p.shape)).astype(np.float32)
        for p in spec.obs_parts
    }
    if spec.obs_parts:
        obs = pack(parts, spec.obs_parts, 64)
    elif spec.obs_categories:
        obs = np.arange(spec.obs_categories).repeat(4)
    elif spec.obs_dtype == "uint8":
        obs = rng.integers(0, 256, (64, *spec.obs_shape)).astype(np.uint8)
    else:
        obs = (rng.standard_normal((64, *spec.obs_shape)) * 3).astype(np.float32)
    for seed in range(20):  # the first initialisation whose discrete action varies over `obs`
        torch.manual_seed(seed)
        point = checkpoint(algo, spec, params(), **stats)  # type: ignore[operator]
        expected = policy_of(point).mode(obs)
        if spec.action_kind == "continuous" or len(set(expected.tolist())) > 1:
            break
    model = export(point, tmp_path / "policy.pt")
    if spec.obs_parts:  # one tensor per part, as the env gives them
        actions = torch.jit.load(str(model))(*(torch.from_numpy(parts[p.name]) for p in spec.obs_parts)).numpy()
    else:
        actions = run_plain_torch(model, obs, tmp_path)
    if spec.action_kind == "discrete":
        assert actions.tolist() == expected.tolist() and len(set(expected.tolist())) > 1
    else:
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)
        assert (actions >= np.array(spec.action_low)).all() and (actions <= np.array(spec.action_high)).all()


def test_eval_of_a_file_that_is_no_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    out = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "eval", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "is not a checkpoint of rlmq up" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(ValueError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "elsewhere")


@pytest.mark.slow
def test_eval_and_export_run_on_a_checkpoint_a_short_run_wrote(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('env_id = "CartPole-v1"\nalgo = "ppo"\nnormalize_obs = true\n')
    run_dir = tmp_path / "run"
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--run-dir",
            str(run_dir),
            "--actors",
            "2",
            "--config",
            str(config),
            "--total-steps",
            "4000",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stdout + up.stderr  # no target: the budget ends it
    point = load_checkpoint(run_dir)
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.clip"} <= set(point.params)
    assert point.params["obs_norm.var"].min() > 0 and np.abs(point.params["obs_norm.mean"]).max() > 0
    assert point.trained_steps > 0

    evaluated = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "eval", str(run_dir), "--episodes", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "over 5 episodes" in evaluated.stdout and f"trained on {point.trained_steps:,} env steps" in evaluated.stdout

    exported = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "export", str(run_dir), "--out", str(tmp_path / "p.pt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    obs = np.random.default_rng(0).uniform(-0.2, 0.2, (32, 4)).astype(np.float32)
    assert run_plain_torch(tmp_path / "p.pt", obs, tmp_path).tolist() == policy_of(point).mode(obs).tolist()


@pytest.mark.parametrize("activation", ["elu", "tanh"])
def test_an_exported_member_keeps_the_activation_pbt_gave_it(tmp_path: Path, activation: str) -> None:
    torch.manual_seed(0)
    point = dataclasses.replace(
        checkpoint("td3", CONTINUOUS, to_numpy_params(TD3Actor(CONTINUOUS, (16,)))), activation=activation
    )
    obs = (np.random.default_rng(1).standard_normal((64, *CONTINUOUS.obs_shape)) * 3).astype(np.float32)
    expected = policy_of(point).mode(obs)
    assert not np.allclose(expected, policy_of(dataclasses.replace(point, activation="")).mode(obs), atol=1e-3)
    actions = run_plain_torch(export(point, tmp_path / "policy.pt"), obs, tmp_path)
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)
