"""End-to-end: `rlmq up` as a user runs it — real processes, a private Redis, real sockets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tb
import torch
from procs import descendants, running, start_up, wait_until_stepping

from rlmq.common import envs
from rlmq.common.loading import from_mapping
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec

pytestmark = pytest.mark.slow


def mean_sampled_return(checkpoint: Path, episodes: int = 20) -> float:
    """Play the saved policy (sampling, as actors do) and return its mean episode return."""
    state = torch.load(checkpoint, weights_only=True)
    spec = from_mapping(EnvSpec, state["env_spec"])
    policy = NumpyPolicy({k: v.numpy() for k, v in state["params"].items()}, spec)
    env = envs.make_vector_env("CartPole-v1", episodes)
    obs, _ = env.reset(seed=123)
    rng = np.random.default_rng(0)
    totals, alive = np.zeros(episodes), np.ones(episodes, bool)
    while alive.any():
        actions, _ = policy.act(np.asarray(obs, np.float32), rng)
        obs, reward, term, trunc, _ = env.step(actions)
        totals += reward * alive
        alive &= ~(term | trunc)
    env.close()
    return float(totals.mean())


def test_up_learns_cartpole_and_restarts_a_killed_actor(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = start_up(
        run_dir,
        "--actors",
        "3",
        "--learners",
        "2",
        "--env",
        "CartPole-v1",
        "--target-return",
        "200",
        "--total-steps",
        "600000",
        "--seed",
        "1",
    )
    wait_until_stepping(run_dir, up)
    status = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "status", str(run_dir)],  # as `rlmq eval RUN_DIR`
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 0 and "state running" in status.stdout, status.stdout + status.stderr
    victims = [pid for pid, cmd in descendants(up.pid).items() if "--name actor-1" in cmd]
    assert len(victims) == 1
    os.kill(victims[0], signal.SIGKILL)
    output, _ = up.communicate(timeout=400)
    assert up.returncode == 0, output
    assert "actor-1 exited with -9; restarting it" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    # Its own evaluation reached 200; the actors' training mean, read later, may have dipped below.
    assert summary["success"], summary
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("time,env_steps") and len(rows) > 3
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    # A random policy averages ~22 on CartPole; the run stopped at a mean of 200, and the last
    # weights of a policy still learning may dip, so the bar is "clearly learned", not 200.
    assert mean_sampled_return(run_dir / "checkpoint.pt") >= 60, "the saved policy did not learn"


@pytest.mark.parametrize("interrupts", [1, 2])
def test_sigint_leaves_no_process_behind(tmp_path: Path, interrupts: int) -> None:
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--actors", "2", "--learners", "2", "--total-steps", "100000000")
    wait_until_stepping(run_dir, up)
    if interrupts == 1:  # while it runs: every process `rlmq up` lists for Prometheus serves rlmq_ metrics
        groups = json.loads((run_dir / "prometheus_targets.json").read_text())
        assert {g["labels"]["role"]: len(g["targets"]) for g in groups} == {"coordinator": 1, "learner": 2, "actor": 2}
        for target in (t for g in groups for t in g["targets"]):
            text = urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
            assert "rlmq_" in text, target
    tree = descendants(up.pid)
    assert sum("rlmq.cli actor" in c for c in tree.values()) == 2, tree
    assert any("server" in c for c in tree.values()), "the private Redis server runs under rlmq up"
    started = time.monotonic()
    for _ in range(interrupts):
        up.send_signal(signal.SIGINT)
        time.sleep(0.3)
    output, _ = up.communicate(timeout=60)
    assert up.returncode == 130, output
    if interrupts == 2:
        assert time.monotonic() - started < 10, "a second interrupt must stop at once"
    time.sleep(0.5)
    left = {pid: cmd for pid, cmd in tree.items() if running(pid)}
    assert not left, f"processes left behind: {left}"


def test_budget_spent_before_the_target_exits_3(tmp_path: Path) -> None:
    up = start_up(
        tmp_path / "run", "--actors", "1", "--learners", "1", "--total-steps", "3000", "--target-return", "475"
    )
    output, _ = up.communicate(timeout=120)
    assert up.returncode == 3, output
    assert "target not reached" in output and "raise --total-steps" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"] == "budget" and not summary["success"] and summary["env_steps"] >= 3000
    # What it reports is the run's own evaluation of the final weights, not the actors' word.
    evaluation = summary["evaluation"]
    assert evaluation["episodes"] == 10 and evaluation["deterministic"] and evaluation["version"] >= 1, evaluation
    assert f"the run's own evaluation: {evaluation['mean_return']:.1f} ±" in output, output
    # and the curves draw it, though no tick came after it
    drawn = tb.scalars(tmp_path / "run" / "tb")["evaluation/return"]
    assert drawn[-1][1] == pytest.approx(evaluation["mean_return"], rel=1e-6), drawn


@pytest.mark.parametrize("transport", ["tcp"])  # ipc, the default: tests/test_api.py, in the README's run
def test_experience_goes_over_unix_sockets_or_loopback_tcp(tmp_path: Path, transport: str) -> None:
    """Either way the learners' experience sockets carry the run (actors collect only on the credits
    those sockets bring them); a Unix socket's directory goes when the run does."""
    up = start_up(
        tmp_path / "run", "--actors", "2", "--learners", "2", "--total-steps", "20000", "--transport", transport
    )
    output, _ = up.communicate(timeout=180)
    assert up.returncode == 0, output
    logs = "".join((tmp_path / "run" / "logs" / f"learner-{rank}.log").read_text() for rank in range(2))
    endpoints = re.findall(r"experience at (\S+)", logs)
    assert len(endpoints) == 2 and all(e.startswith(f"{transport}://") for e in endpoints), endpoints
    if transport == "ipc":
        assert not any(Path(e.removeprefix("ipc://")).parent.exists() for e in endpoints)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 20000 and summary["episodes"] > 0, summary


@pytest.mark.parametrize(
    "args, words",
    [
        (["--env", "NoSuchEnv-v0"], "unknown env"),
        (["--env", "Blackjack-v1"], "not a Box"),
        (["--algo", "a2c"], "algo 'a2c' is not one of"),
        (["--num-envs", "0"], "num_envs must be at least 1"),
        (["--actors", "2", "--population", "3"], "use --actors 3 or more"),
        (["--algo", "sac"], "use --algo ppo"),  # CartPole's actions are discrete
        (["--device", "gpu"], "use auto, cpu, cuda or cuda:N"),
        (["--transport", "udp"], "use ipc or tcp"),
    ],
)
def test_bad_usage_exits_2_and_names_the_fix(tmp_path: Path, args: list[str], words: str) -> None:
    up = start_up(tmp_path / "run", *args)
    output, _ = up.communicate(timeout=60)
    assert up.returncode == 2, output
    assert words in output and "Traceback" not in output


def test_resume_and_a_used_run_directory_are_refused_naming_the_fix(tmp_path: Path) -> None:
    def up(*args: str) -> tuple[int, str]:
        done = subprocess.run(
            [sys.executable, "-m", "rlmq.cli", "up", *args], capture_output=True, text=True, timeout=60
        )
        return done.returncode, done.stdout + done.stderr

    code, out = up("--resume", str(tmp_path / "nothing"))
    assert code == 2 and "not a run directory of rlmq up" in out and "Traceback" not in out, out
    used = tmp_path / "used"
    (used / "checkpoints" / "rank0").mkdir(parents=True)
    (used / "checkpoints" / "rank0" / "00000001.pt").write_bytes(b"")
    code, out = up("--run-dir", str(used))
    assert code == 2 and f"continue it with --resume {used}" in out, out
    code, out = up("--resume", str(used), "--run-dir", str(used))
    assert code == 2 and "drop --config and --run-dir" in out, out
