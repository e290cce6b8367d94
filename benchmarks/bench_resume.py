"""Resume: does a run stopped with Ctrl-C and continued with `rlmq up --resume` need more env steps
to its target than the same run left alone? Side by side, per seed, in one invocation.

    .venv/bin/python benchmarks/bench_resume.py [--seeds 0 1 2] [--cases ppo-cartpole sac-pendulum]

Each case runs `rlmq up --actors 2 --learners 1 --env ENV --algo ALGO --target-return T` (the
shipped config) twice per seed: once uninterrupted; once stopped (SIGINT) when Redis counts
`stop_at` env steps, then `rlmq up --resume RUN_DIR --target-return T`. Printed: the env steps
each needed in total (the resumed run's counter goes on from the stopped one's), and, for replay
algorithms, the transitions the replay held in the checkpoint written at the stop and in the
resumed run's last, and whether the transitions held at the stop are still there, row for row.

Results go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlmq.cli.rundir import run_redis_of
from rlmq.coordinator.store import RunStore

CASES = {  # name → (env, algo, target, stop at env steps)
    "ppo-cartpole": ("CartPole-v1", "ppo", 475.0, 30_000),
    "sac-pendulum": ("Pendulum-v1", "sac", -200.0, 5_000),
}


def up(run_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rlmq.cli", "up", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def env_steps(run_dir: Path) -> int:
    try:
        return int(RunStore.connect(*run_redis_of(run_dir), timeout_s=0.5, report=None).status().env_steps)
    except Exception:  # not started, or between sessions
        return 0


def newest_replay(run_dir: Path) -> dict[str, torch.Tensor] | None:
    """The replay in rank 0's newest checkpoint; None for an algorithm without one."""
    newest = max((run_dir / "checkpoints" / "rank0").glob("*.pt"))
    return torch.load(newest, weights_only=True)["trainer"].get("replay")


def replay_kept(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> str:
    """ "N → M, kept" when every transition `before` held is in `after` unchanged (the ring had not
    wrapped: the rows stay where they were written)."""
    kept = all(
        torch.equal(after[name][m, : int(rows)], before[name][m, : int(rows)])
        for name in ("_rewards", "_obs_key", "_actions")
        for m, rows in enumerate(before["_size"])
    )
    return f"{int(before['_size'].sum()):,} → {int(after['_size'].sum()):,}, {'kept' if kept else 'NOT kept'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rlmq-resume-"))
    print(
        "| case | seed | env steps to target, uninterrupted | stopped at | "
        "env steps to target, stopped and resumed | "
        "resumed ÷ uninterrupted | replay at the stop → after resuming |"
    )
    print("|---|--:|--:|--:|--:|--:|---|")
    for case in args.cases:
        env, algo, target, stop_at = CASES[case]
        common = ["--actors", "2", "--learners", "1", "--env", env, "--algo", algo, "--target-return", str(target)]
        for seed in args.seeds:
            alone = root / f"{case}-{seed}-alone"
            up(alone, *common, "--seed", str(seed), "--run-dir", str(alone)).wait()
            straight = json.loads((alone / "summary.json").read_text())["env_steps"]
            broken = root / f"{case}-{seed}-resumed"
            first = up(broken, *common, "--seed", str(seed), "--run-dir", str(broken), "--checkpoint-every", "5")
            while first.poll() is None and env_steps(broken) < stop_at:
                time.sleep(0.05)
            stopped = env_steps(broken)
            first.send_signal(signal.SIGINT)
            first.wait()
            at_stop = newest_replay(broken)
            up(broken, "--resume", str(broken), "--actors", "2", "--target-return", str(target)).wait()
            summary = json.loads((broken / "summary.json").read_text())
            resumed = summary["env_steps"] if summary.get("success") else float("nan")
            after = newest_replay(broken)
            replay = replay_kept(at_stop, after) if at_stop is not None and after is not None else "—"
            print(
                f"| {case} | {seed} | {straight:,} | {stopped:,} | {resumed:,} | {resumed / straight:.2f} | {replay} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
