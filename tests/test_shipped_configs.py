"""The shipped run configs: each loads and fits its env, one per env and algorithm, and `rlmq up`
picks it by --env and --algo alone; an env whose extra is missing names the pip command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlmq.cli.shipped import pick, shipped
from rlmq.cli.upconfig import UpConfig
from rlmq.common import envs
from rlmq.common.loading import load_run_config

SHIPPED = shipped()


def test_the_configs_the_issue_names_are_shipped() -> None:
    pairs = {(s.env_id, s.algo) for s in SHIPPED if s.population == 1}
    assert pairs >= {
        ("CartPole-v1", "ppo"),
        ("CartPole-v1", "dqn"),
        ("Pendulum-v1", "sac"),
        ("Pendulum-v1", "td3"),
        ("LunarLander-v3", "ppo"),
        ("LunarLander-v3", "dqn"),
        ("LunarLanderContinuous-v3", "sac"),
        ("LunarLanderContinuous-v3", "td3"),
        ("HalfCheetah-v5", "sac"),
        ("HalfCheetah-v5", "ppo"),
        ("Acrobot-v1", "ppo"),
        ("Acrobot-v1", "dqn"),
        ("MinAtar/Breakout-v1", "ppo"),
        ("MinAtar/Breakout-v1", "dqn"),
        ("ALE/Pong-v5", "ppo"),
    }


@pytest.mark.parametrize("config", SHIPPED, ids=[s.path.name for s in SHIPPED])
def test_a_shipped_config_loads_and_fits_its_env(config: object) -> None:
    run_config = load_run_config(config.path, {})  # type: ignore[attr-defined]
    assert (run_config.env_id, run_config.algo) == (config.env_id, config.algo)  # type: ignore[attr-defined]
    envs.probe(
        run_config.env_id, run_config.algo, frame_stack=run_config.frame_stack
    )  # the env builds, and its actions fit the algorithm
    assert config.summary  # type: ignore[attr-defined]  # `rlmq configs` has a line to show


def test_one_single_agent_config_per_env_and_algorithm() -> None:
    pairs = [(s.env_id, s.algo) for s in SHIPPED if s.population == 1]
    assert len(pairs) == len(set(pairs))


def test_up_picks_the_shipped_config_without_config(tmp_path: Path) -> None:
    """The issue's example: SAC on Pendulum judged over its config's 20-episode window, not 100."""
    up = UpConfig.build(
        actors=2,
        learners=1,
        config=None,
        overrides={"env_id": "Pendulum-v1", "algo": "sac"},
        redis_url=None,
        run_dir=tmp_path,
        torch_threads=1,
    )
    found = pick("Pendulum-v1", "sac")
    assert found is not None and up.config_from == str(found.path) and found.path.name == "sac-pendulum.toml"
    assert up.run_config.return_window == 20 and up.run_config.total_steps == 20_000
    flags = UpConfig.build(
        actors=2,
        learners=1,
        config=None,
        redis_url=None,
        run_dir=tmp_path,
        torch_threads=1,
        overrides={"env_id": "Pendulum-v1", "algo": "sac", "total_steps": 5000},
    )
    assert flags.run_config.total_steps == 5000  # flags still override it
    plain = UpConfig.build(
        actors=2,
        learners=1,
        config=None,
        overrides={"env_id": "MountainCarContinuous-v0", "algo": "sac"},
        redis_url=None,
        run_dir=tmp_path,
        torch_threads=1,
    )
    assert plain.config_from == "" and plain.run_config.return_window == 100


@pytest.mark.slow
def test_rlmq_configs_lists_them() -> None:
    """(That `rlmq up` says which one it uses: tests/test_api.py, in the README's run.)"""
    listed = subprocess.run([sys.executable, "-m", "rlmq.cli", "configs"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "td3-pendulum.toml" in listed.stdout and "Pendulum-v1" in listed.stdout


# What a machine without the extra's package sees: the import fails (a None entry in sys.modules
# makes `import Box2D` raise ImportError, as a missing package does).
WITHOUT = "import sys; sys.modules[{module!r}] = None; from rlmq.cli.app import main; sys.argv[0] = 'rlmq'; main()"


@pytest.mark.parametrize(
    ("module", "env_id", "extra"), [("Box2D", "LunarLander-v3", "box2d"), ("mujoco", "HalfCheetah-v5", "mujoco")]
)
def test_a_missing_extra_names_the_pip_command(tmp_path: Path, module: str, env_id: str, extra: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT.format(module=module),
            "up",
            "--env",
            env_id,
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f'pip install "rlmq[{extra}]"' in out.stderr
