"""What a fleet of actors costs the coordinator, Redis and a learner, as it grows (issue 45).

For each `--identities` size, one after the other: separate services on this host
(tests/helpers/fleet_run.py: a private Redis, the coordinator, one learner rank, every socket on
CURVE, the keys holding the fleet's key), configs/ppo-cartpole.toml, and a simulated fleet of that
many actor identities in one process (tests/helpers/simulated_fleet.py: each with its own sockets,
speaking the actors' protocol). Once every identity is assigned and rollouts flow, each process's
CPU (user + system, every thread: the ZeroMQ I/O threads' CURVE included) and resident memory are
read from /proc over `--window-s`, with the fleet's message counts and the run's policy versions.
With `--baseline DIR` (another checkout of rlmq, e.g. `git worktree add DIR REV`), every size runs
there too, just before this tree's, its services and simulated fleet its own: before and after
side by side in one run.

    python benchmarks/bench_fleet.py --identities 64 256 1024 --window-s 20
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlmq.common.loading import load_run_config  # noqa: E402
from rlmq.common.service import die_with_parent  # noqa: E402
from tests.helpers.fleet_run import FleetRun  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system seconds of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def last_stats(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else {}


@dataclasses.dataclass
class Sample:
    at: float
    cpu: dict[str, float]
    counts: dict[str, Any]
    policy_version: int
    env_steps: int


def sample(pids: dict[str, int], run: FleetRun, stats: Path) -> Sample:
    status = run.status()
    return Sample(
        time.monotonic(),
        {name: cpu_s(pid) for name, pid in pids.items()},
        last_stats(stats),
        status.policy_version,
        status.env_steps,
    )


def measure(root: Path, identities: int, window_s: float, timeout_s: float, tree: Path) -> dict[str, Any]:
    """One size, with the services and the simulated fleet of the rlmq checkout `tree`."""
    if tree == ROOT:  # the installed (editable) rlmq is this tree
        os.environ.pop("PYTHONPATH", None)
    else:  # FleetRun's services inherit it
        os.environ["PYTHONPATH"] = str(package_dir(tree))
    config = load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {})
    config = dataclasses.replace(config, total_steps=10**12)
    run = FleetRun(root, config, actors=0, start_actors=False)
    stats = root / "fleet-stats.jsonl"
    with open(root / "fleet.log", "wb") as log:
        fleet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.simulated_fleet",
                *("--keys", str(run.keys), "--coordinator", run.control, "--broadcast", run.broadcast),
                *("--identities", str(identities), "--stats", str(stats)),
            ],
            cwd=tree,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    try:
        pids = {
            "coordinator": run.processes[0].pid,
            "learner": run.processes[1].pid,
            "redis": run.redis.process.pid,
            "fleet": fleet.pid,
        }
        started, deadline = time.monotonic(), time.monotonic() + timeout_s
        while True:
            counts = last_stats(stats)
            if counts.get("assigned") == identities and counts.get("rollouts", 0) > 0:
                break
            if time.monotonic() > deadline or fleet.poll() is not None:
                raise SystemExit(f"{identities} identities: not all assigned and stepping; logs in {root}")
            time.sleep(0.5)
        joined_s = time.monotonic() - started
        time.sleep(5.0)  # every identity's probation credit is behind it
        before = sample(pids, run, stats)
        time.sleep(window_s)
        after = sample(pids, run, stats)
        span = after.at - before.at

        def rate(key: str) -> float:
            return (after.counts[key] - before.counts[key]) / span

        acks = after.counts["acks"] - before.counts["acks"]
        return {
            "tree": str(tree),
            "identities": identities,
            "joined_s": joined_s,
            "cpu": {name: (after.cpu[name] - before.cpu[name]) / span for name in pids},
            "rss_mb": {name: rss_mb(pid) for name, pid in pids.items()},
            "reports_per_s": rate("reports"),
            "acks_per_s": rate("acks"),
            "ack_delay_ms": 1000 * (after.counts["ack_delay_s"] - before.counts["ack_delay_s"]) / max(acks, 1),
            "broadcast_weights_per_s": rate("broadcast_weights"),
            "broadcast_mb_per_s": rate("broadcast_bytes") / 1e6,
            "learner_weights_per_s": rate("learner_weights"),
            "learner_weights_mb_per_s": rate("learner_weights_bytes") / 1e6,
            "credit_requests_per_s": rate("credit_requests"),
            "rollouts_per_s": rate("rollouts"),
            "env_steps_per_s": (after.env_steps - before.env_steps) / span,
            "updates_per_s": (after.policy_version - before.policy_version) / span,
            "rejected": after.counts["rejected"],
        }
    finally:
        fleet.terminate()
        try:
            fleet.wait(15)
        except subprocess.TimeoutExpired:
            fleet.kill()
        run.close()


def package_dir(tree: Path) -> Path:
    """A directory in which `import rlmq` finds the checkout `tree` (the repository root is the
    package): ahead of the installed one on PYTHONPATH."""
    link_dir = tree.parent / f".{tree.name}-as-package"
    link_dir.mkdir(exist_ok=True)
    if not (link_dir / "rlmq").exists():
        (link_dir / "rlmq").symlink_to(tree.resolve())
    return link_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--identities", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--baseline", type=Path, help="Another rlmq checkout, measured before this one.")
    parser.add_argument("--json", type=Path, help="Write the measurements here too.")
    args = parser.parse_args()
    trees = [args.baseline.resolve(), ROOT] if args.baseline is not None else [ROOT]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for n in args.identities:
            for i, tree in enumerate(trees):
                result = measure(Path(tmp) / f"fleet-{n}-{i}", n, args.window_s, args.timeout_s, tree)
                results.append(result)
                print(json.dumps(result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
