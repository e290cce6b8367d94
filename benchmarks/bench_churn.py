"""Actor churn: `rlmq up --actors 4 --learners 2` on CartPole with one actor SIGKILLed every
`--kill-every` seconds, against the same run without churn, side by side in one invocation.

Two measurements (issue: a dead peer never stalls learning):
1. no target, a fixed window: the learners' longest stall (the longest time learner-0's update
   counter stood still, polled every 50 ms) and update count, churn / no churn;
2. `--target-return 475` for each seed: wall time to the target, churn / no churn.

    .venv/bin/python benchmarks/bench_churn.py [--window 120] [--kill-every 10] [--first-kill 2]
        [--seeds 0 1 2] [--config FILE] [--skip-window]

The first kill comes `--first-kill` seconds after the first update, so that a run which reaches
the target in less than a period meets the churn too. `rlmq up` passes the environment on to the learners:
RLMQ_CREDIT_TIMEOUT_MIN_S sets their grant timeout's floor.

Results go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
from procs import descendants  # noqa: E402  (the tests' helper, on the path above)


def updates(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("rlmq_learner_updates_total")
    )


def run(
    run_dir: Path,
    window: float | None,
    kill_every: float | None,
    seed: int,
    target: bool,
    config: str | None,
    first_kill: float = 2.0,
) -> dict[str, float]:
    """One `rlmq up`; with `window`, stopped (SIGINT) `window` s after the first update."""
    args = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "up",
        "--actors",
        "4",
        "--learners",
        "2",
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
        "--total-steps",
        "100000000",
        *(["--config", config] if config else []),
    ]
    if target:
        args += ["--target-return", "475"]
    up = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = None
    while port is None and up.poll() is None:
        time.sleep(0.1)
        try:
            groups = json.loads((run_dir / "prometheus_targets.json").read_text())
            port = next(
                int(t.rsplit(":", 1)[1]) for g in groups if g["labels"]["role"] == "learner" for t in g["targets"]
            )
            updates(port)
        except (OSError, ValueError, StopIteration):
            port = None
    last_change, count, longest, first = None, 0.0, 0.0, None
    next_kill = None
    kills = 0
    while up.poll() is None:
        time.sleep(0.05)
        now = time.monotonic()
        try:
            seen = updates(port) if port else 0.0
        except OSError:
            continue
        if seen != count:
            if last_change is not None:
                longest = max(longest, now - last_change)
            last_change, count = now, seen
            first = first or now
            next_kill = next_kill or (now + first_kill if kill_every else None)
        elif last_change is not None:
            longest = max(longest, now - last_change)
        if next_kill is not None and now >= next_kill:
            actors = [pid for pid, cmd in descendants(up.pid).items() if " actor --name " in cmd]
            if actors:
                os.kill(random.choice(actors), signal.SIGKILL)
                kills += 1
            next_kill += kill_every or 0
        if window is not None and first is not None and now - first >= window:
            window_updates = count
            up.send_signal(signal.SIGINT)
            up.wait(60)
            return {"updates": window_updates, "longest_stall_s": longest, "kills": kills}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "updates": count,
        "longest_stall_s": longest,
        "kills": kills,
        "train_wall_s": summary["train_wall_s"],
        "success": summary["success"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--kill-every", type=float, default=10.0)
    parser.add_argument("--first-kill", type=float, default=2.0, help="seconds after the first update")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--config", help="a run config for every run (e.g. rank_wait_s)")
    parser.add_argument("--skip-window", action="store_true", help="only the runs to the target")
    args = parser.parse_args()
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_window:
            base = run(Path(tmp) / "window-calm", args.window, None, 0, False, args.config)
            churn = run(
                Path(tmp) / "window-churn", args.window, args.kill_every, 0, False, args.config, args.first_kill
            )
            print(
                f"window {args.window:.0f} s, no target: updates {base['updates']:.0f} calm, {churn['updates']:.0f} "
                f"with churn ({churn['kills']} kills): ratio {churn['updates'] / max(base['updates'], 1):.3f}; "
                f"longest stall {base['longest_stall_s']:.2f} s calm, {churn['longest_stall_s']:.2f} s with churn",
                flush=True,
            )
        for seed in args.seeds:
            calm = run(Path(tmp) / f"target-calm-{seed}", None, None, seed, True, args.config)
            stormy = run(
                Path(tmp) / f"target-churn-{seed}", None, args.kill_every, seed, True, args.config, args.first_kill
            )
            print(
                f"seed {seed}, target 475: train wall {calm['train_wall_s']:.1f} s calm (success {calm['success']}), "
                f"{stormy['train_wall_s']:.1f} s with churn ({stormy['kills']} kills, success {stormy['success']}): "
                f"ratio {stormy['train_wall_s'] / calm['train_wall_s']:.2f}; longest stall "
                f"{stormy['longest_stall_s']:.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
