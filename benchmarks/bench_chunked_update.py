"""An off-policy population's update in chunks (`max_steps_per_update`): how long the learner goes
between agreements (where it reads a stop and writes checkpoints), and what a Ctrl-C then costs,
with whole updates and in chunks, one after the other in one invocation.

    .venv/bin/python benchmarks/bench_chunked_update.py [--config configs/dvd-td3-halfcheetah.toml]
        [--caps 0 64] [--stop-at 30000] [--actors 5] [--seed 0]

For each cap: `rlmq up --actors A --learners 1` on a copy of the config with the algorithm's
`max_steps_per_update` set to it. The learner's update count (`rlmq_learner_update_seconds_count`
on its /metrics) is polled every 0.1 s; once it has begun, the longest stretch without a finished
update bounds how long the world went without agreeing (the most a stop waits). When Redis counts
`--stop-at` env steps the run gets SIGINT, as Ctrl-C gives it (that count moves while the learner
grants credits, between its updates, so the signal tends to land outside one): printed are the seconds to the exit,
whether the learner wrote its checkpoint after the signal or was killed first (`rlmq up` gives it
15 s), and the env steps per second while it trained.

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
import tomllib
import urllib.request
from pathlib import Path

from rlmq.cli.rundir import run_redis_of
from rlmq.coordinator.store import RunStore

POLL_S = 0.1
COUNT = "rlmq_learner_update_seconds_count"


def updates_done(run_dir: Path) -> float | None:
    """The learner's finished updates, from its /metrics; None before it answers."""
    try:
        port = json.loads((run_dir / "ports" / "learner-0.json").read_text())["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
    except (OSError, ValueError, KeyError):
        return None
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(COUNT)), None)


def env_steps(run_dir: Path) -> int:
    try:
        return int(RunStore.connect(*run_redis_of(run_dir), timeout_s=0.5, report=None).status().env_steps)
    except Exception:  # not started yet
        return 0


def run(config: dict, cap: int, args: argparse.Namespace, scratch: Path) -> dict[str, object]:
    config = {**config, config["algo"]: {**config[config["algo"]], "max_steps_per_update": cap}}
    config_path = scratch / f"cap-{cap}.json"
    config_path.write_text(json.dumps(config))
    run_dir = scratch / f"run-{cap}"
    up = subprocess.Popen(
        [sys.executable, "-m", "rlmq.cli", "up", "--actors", str(args.actors), "--learners", "1"]
        + ["--config", str(config_path), "--seed", str(args.seed), "--total-steps", "100000000"]
        + ["--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    count, changed_at, longest, first_at, steps_at_first = None, 0.0, 0.0, None, 0
    steps, steps_read = 0, 0.0
    while up.poll() is None:
        now = time.monotonic()
        done = updates_done(run_dir)
        if done is not None and done != count:
            if count is not None and count > 0:
                longest = max(longest, now - changed_at)
            count, changed_at = done, now
        if now - steps_read > 1.0:
            steps, steps_read = env_steps(run_dir), now
            if first_at is None and count:
                first_at, steps_at_first = now, steps
            if steps >= args.stop_at:
                break
        time.sleep(POLL_S)
    trained_s = time.monotonic() - (first_at or time.monotonic())
    rate = (steps - steps_at_first) / trained_s if trained_s > 0 else float("nan")
    signalled = time.monotonic()
    up.send_signal(signal.SIGINT)
    up.wait(timeout=120)
    exit_s = time.monotonic() - signalled
    log = (run_dir / "logs" / "learner-0.log").read_text().splitlines()
    after = log[next((i for i, line in enumerate(log) if "stopping warmly" in line), len(log)) :]
    saved = any("checkpoint" in line and "written" in line for line in after)
    return {
        "cap": cap,
        "updates": int(count or 0),
        "longest_without_update_s": round(longest, 2),
        "ctrl_c_to_exit_s": round(exit_s, 2),
        "checkpoint_after_signal": saved,
        "env_steps_per_s": round(rate, 1),
        "env_steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/dvd-td3-halfcheetah.toml"))
    parser.add_argument("--caps", type=int, nargs="+", default=[0, 64])
    parser.add_argument("--stop-at", type=int, default=30_000)
    parser.add_argument("--actors", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    config = tomllib.loads(args.config.read_text())
    results = []
    with tempfile.TemporaryDirectory(prefix="rlmq-chunks-") as scratch:
        for cap in args.caps:
            results.append(run(config, cap, args, Path(scratch)))
            print(json.dumps(results[-1]), flush=True)
    print(f"\n{args.config}, {args.actors} actors, SIGINT at {args.stop_at:,} env steps\n")
    print(
        "| max_steps_per_update | updates | longest without an update (s) | Ctrl-C to exit (s) "
        "| checkpoint after the signal | env steps/s while training |"
    )
    print("|--:|--:|--:|--:|:--|--:|")
    for r in results:
        print(
            f"| {r['cap'] or 'whole'} | {r['updates']} | {r['longest_without_update_s']} | {r['ctrl_c_to_exit_s']} "
            f"| {'yes' if r['checkpoint_after_signal'] else 'no'} | {r['env_steps_per_s']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
