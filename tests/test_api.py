"""The Python API (`rlmq.train`, `rlmq.load_policy`): the README's script run as a user runs it,
the run's TensorBoard curves read back by TensorBoard's own reader, and what the API refuses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tb

import rlmq

ROOT = Path(__file__).resolve().parent.parent


def readme_script() -> str:
    """The Python block after the README's `<!-- python-api -->` marker."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- python-api -->\n```python\n(.*?)```", text, re.S)
    assert found, "README.md lost its python-api block"
    return found.group(1)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The README's script, run in a fresh directory: (its output, the run directory)."""
    where = tmp_path_factory.mktemp("readme")
    done = subprocess.run(
        [sys.executable, "-c", readme_script()], cwd=where, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in (where / "runs").iterdir() if not p.is_symlink()]
    return done.stdout, run_dir


@pytest.mark.slow
def test_the_readme_script_trains_cartpole_to_475_and_plays_the_policy(readme_run: tuple[str, Path]) -> None:
    assert len([line for line in readme_script().splitlines() if line.strip()]) < 10
    output, run_dir = readme_run
    trained, played = (float(x) for x in output.strip().splitlines()[-1].split())
    assert trained >= 475 and played >= 475, output
    # what `rlmq up` says and does by default: the shipped config, experience over Unix sockets
    # whose directory goes with the run
    assert "rlmq up: config " in output and "ppo-cartpole.toml" in output, output
    (endpoint,) = re.findall(r"experience at (\S+)", (run_dir / "logs" / "learner-0.log").read_text())
    assert endpoint.startswith("ipc://") and not Path(endpoint.removeprefix("ipc://")).parent.exists()


@pytest.mark.slow
def test_tensorboard_reads_back_the_runs_returns_losses_and_evaluation(readme_run: tuple[str, Path]) -> None:
    _, run_dir = readme_run
    curves = tb.scalars(run_dir / "tb")
    returns = curves["episode/return"]
    assert len(returns) >= 3 and [s for s, _ in returns] == sorted(s for s, _ in returns), returns
    assert returns[-1][1] > returns[0][1]  # it learned
    for tag in ("episode/length", "learner/pg_loss", "learner/v_loss", "learner/entropy", "learner/policy_lag"):
        assert curves[tag], tag
    assert curves["throughput/env_steps_per_s"][-1][1] > 0 and curves["evaluation/return"][-1][1] >= 475
    # one writer, the coordinator: every event file under tb/ is one process's
    writers = {f.name.split(".")[-2] for f in (run_dir / "tb").rglob("events.out.tfevents.*")}
    assert len(writers) == 1, writers


def test_train_refuses_what_rlmq_up_refuses_with_the_same_words(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown env 'NoSuchEnv-v0'"):
        rlmq.train(env="NoSuchEnv-v0", run_dir=tmp_path / "a")
    with pytest.raises(ValueError, match="use --actors 3 or more"):
        rlmq.train(rlmq.RunConfig(population=3), actors=2, run_dir=tmp_path / "b")
    with pytest.raises(ValueError, match="ppo.epochs: expected int"):
        (tmp_path / "bad.toml").write_text("[ppo]\nepochs = 2.5\n")
        rlmq.train(tmp_path / "bad.toml", run_dir=tmp_path / "c")
    assert not (tmp_path / "a").exists()  # refused before anything was made


def test_load_policy_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no checkpoint at"):
        rlmq.load_policy(tmp_path)


@pytest.mark.slow
def test_a_loaded_policy_takes_one_observation_or_a_batch_and_samples_on_request(
    readme_run: tuple[str, Path],
) -> None:
    _, run_dir = readme_run
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32) * 0.05
    greedy = rlmq.load_policy(run_dir)
    assert greedy(obs).shape == (16,) and greedy(obs[3]) == greedy(obs)[3]
    sampled = [rlmq.load_policy(run_dir, deterministic=False, seed=s)(obs) for s in (0, 0, 1)]
    assert (sampled[0] == sampled[1]).all() and set(np.unique(np.concatenate(sampled))) <= {0, 1}
