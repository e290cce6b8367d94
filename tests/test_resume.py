"""`rlmq up --resume RUN_DIR`: a run stopped with Ctrl-C goes on where it was (real processes, the
run's own private Redis brought back from its append-only file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tb
import torch
from procs import in_redis, start_up, stop_with_ctrl_c, wait_for, wait_until_stepping

from rlmq.learners import checkpoint

pytestmark = pytest.mark.slow

# DQN for its replay, a population of two for PBT, normalized observations for their statistics.
CONFIG = """
env_id = "CartPole-v1"
algo = "dqn"
population = 2
normalize_obs = true
num_envs = 4
[dqn]
hidden_sizes = [32]
learning_starts = 500
replay_ratio = 0.25
buffer_size = 50_000
[pbt]
interval = 1_500
fitness_episodes = 5
[pbt.ranges.learning_rate]
low = 1e-4
high = 1e-2
log = true
"""


def test_a_run_stopped_with_ctrl_c_resumes_where_it_was(tmp_path: Path) -> None:
    config = tmp_path / "dqn-pbt.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--actors", "2", "--config", str(config), "--total-steps", "1000000")
    store = wait_until_stepping(run_dir, up)
    wait_for(lambda: store.status().pbt_decisions >= 1, 120, "a PBT decision", up)
    stopped_at, saved = stop_with_ctrl_c(up, run_dir)
    before, decisions, _ = in_redis(run_dir)
    curve_rows = len((run_dir / "metrics.csv").read_text().splitlines())

    budget = before.env_steps + 2_000
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--resume",
            str(run_dir),
            "--actors",
            "2",
            "--total-steps",
            str(budget),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"rlmq up: run {json.loads((run_dir / 'run.json').read_text())['run']} in {run_dir}" in resumed.stdout
    assert f"rlmq up: config: the run's own, {run_dir / 'config.json'}" in resumed.stdout
    log = (run_dir / "logs" / "learner-0.log").read_text()
    assert f"resumed from checkpoint {stopped_at}" in log, log
    after = checkpoint.Checkpoints(run_dir / "checkpoints", 0, kept=3).load(stopped_at + 1)

    # env-step and episode counters, policy versions, PBT history and generations go on
    # below before + budget: --total-steps counts from the resumed counter, not afresh on top of it
    # (how far past the budget the actors run while the run stops depends on the host's speed)
    status, decisions_after, _ = in_redis(run_dir)
    assert budget <= status.env_steps < before.env_steps + budget and status.episodes > before.episodes
    assert all(a >= b for a, b in zip(after["learner"]["versions"], saved["learner"]["versions"], strict=True))
    assert decisions_after[: len(decisions)] == decisions and status.pbt_decisions >= before.pbt_decisions >= 1
    assert after["learner"]["applied"] >= saved["learner"]["applied"] >= 1
    # the learner's state went on from the checkpoint's: fewer new env steps than before the stop,
    # so counts below the checkpoint's would mean it started afresh
    trainer, then = after["trainer"], saved["trainer"]
    assert (trainer["obs_norm"]["count"] >= then["obs_norm"]["count"]).all()
    assert (trainer["algorithm"]["optimizers"]["q"]["steps"] >= then["algorithm"]["optimizers"]["q"]["steps"]).all()
    assert all(a >= b for a, b in zip(trainer["stored"], then["stored"], strict=True))
    # the replay kept every transition it held (the ring is far from full: none was overwritten)
    size = then["replay"]["_size"]
    assert (trainer["replay"]["_size"] > size).all()
    for member in range(2):
        rows = int(size[member])
        assert torch.equal(trainer["replay"]["_rewards"][member, :rows], then["replay"]["_rewards"][member, :rows])
        assert torch.equal(trainer["replay"]["_obs_key"][member, :rows], then["replay"]["_obs_key"][member, :rows])
    # the curves in the run directory hold both sessions
    assert len((run_dir / "metrics.csv").read_text().splitlines()) > curve_rows

    # TensorBoard: each member's curves and hyperparameters, an HParams session per set of them
    # (a PBT decision starts its target's next), written on by the resumed run's coordinator
    decision = decisions[0]
    for member in range(2):
        curves = tb.scalars(run_dir / "tb" / f"member_{member}")
        assert curves["episode/return"] and curves["hyperparameters/learning_rate"], sorted(curves)
        sessions = tb.sessions(run_dir / "tb" / f"member_{member}")
        assert sessions[0]["learning_rate"] == pytest.approx(curves["hyperparameters/learning_rate"][0][1])
    assert decision.hyperparams in [pytest.approx(s) for s in tb.sessions(run_dir / "tb" / f"member_{decision.target}")]
    run_curves = tb.scalars(run_dir / "tb")
    assert run_curves["learner/q_loss"] and run_curves["pbt/decisions"][-1][1] >= 1, sorted(run_curves)
    # the resumed run's points: a tag every tick writes (the window's mean has no point while a
    # PBT copy has just cleared the members' returns and no episode has ended since)
    assert run_curves["throughput/env_steps_per_s"][-1][0] > before.env_steps
