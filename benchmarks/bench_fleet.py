"""What a fleet of actors costs the coordinator, Redis and a learner, as it grows (issue 45).

For each `--identities` size, one after the other: separate services on this host
(tests/helpers/fleet_run.py: a private Redis, the coordinator, one learner rank, every socket on
CURVE, the keys holding the fleet's key), configs/ppo-cartpole.toml, and a simulated fleet of that
many actor identities in one process (tests/helpers/simulated_fleet.py: each with its own sockets,
speaking the actors' protocol). Once every identity is assigned and rollouts flow, each process's
CPU (user + system, every thread: the ZeroMQ I/O threads' CURVE included) and resident memory are
read from /proc over `--window-s`, with the fleet's message counts, the run's policy versions and
the learner's queue (its metrics, read four times a second).
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

from benchmarks.bench_scaling import scrape  # noqa: E402
from benchmarks.fleet_model import (  # noqa: E402
    ACTOR_TIMEOUT_S,
    calibrate,
    cpu_s,
    model,
    model_table,
    rss_mb,
)
from rlmq.common.config import EvaluationConfig  # noqa: E402
from rlmq.common.loading import load_run_config  # noqa: E402
from rlmq.common.service import die_with_parent  # noqa: E402
from tests.helpers.fleet_run import FleetRun  # noqa: E402

EVALUATE_EVERY_S = 2.0
QUEUE_SAMPLE_S = 0.25


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


class FleetAgainstServices:
    """FleetRun's services (CartPole, every socket on CURVE) and a simulated fleet of `identities`,
    all of the rlmq checkout `tree`; the coordinator's memory read before the fleet starts."""

    def __init__(
        self,
        root: Path,
        identities: int,
        tree: Path,
        timeout_s: float,
        learner_metrics: bool = False,
        **run_fields: Any,
    ) -> None:
        if tree == ROOT:  # the installed (editable) rlmq is this tree
            os.environ.pop("PYTHONPATH", None)
        else:  # FleetRun's services inherit it
            os.environ["PYTHONPATH"] = str(package_dir(tree))
        config = dataclasses.replace(load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {}), **run_fields)
        self.run = run = FleetRun(root, config, actors=0, start_actors=False, learner_metrics=learner_metrics)
        self.stats = root / "fleet-stats.jsonl"
        run.wait(lambda s: s.state == "running" and s.learners == 1, timeout_s, "the learner")
        time.sleep(2.0)
        self.coordinator_rss_before = rss_mb(run.processes[0].pid)
        self.started = time.monotonic()
        with open(root / "fleet.log", "wb") as log:
            self.fleet = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.helpers.simulated_fleet",
                    *("--keys", str(run.keys), "--coordinator", run.control, "--broadcast", run.broadcast),
                    *("--identities", str(identities), "--stats", str(self.stats)),
                ],
                cwd=tree,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self.pids = {
            "coordinator": run.processes[0].pid,
            "learner": run.processes[1].pid,
            "redis": run.redis.process.pid,
            "fleet": self.fleet.pid,
        }

    def close(self) -> None:
        self.fleet.terminate()
        try:
            self.fleet.wait(15)
        except subprocess.TimeoutExpired:
            self.fleet.kill()
        self.run.close()


def to_target(root: Path, identities: int, timeout_s: float, tree: Path) -> dict[str, Any]:
    """CartPole trained to 475 (the run's own evaluation decides) by the simulated fleet: the time
    from the fleet's start to the end, and the coordinator's CPU over it and its peak memory."""
    # Each identity's episode spans many of the learner's versions (its turns come round once per
    # fleet), so its returns tell late what the newest weights do: the run evaluates them on a clock.
    clocked = EvaluationConfig(every_s=EVALUATE_EVERY_S)
    services = FleetAgainstServices(
        root, identities, tree, timeout_s, target_return=475.0, total_steps=5_000_000, evaluation=clocked
    )
    run = services.run
    try:
        cpu = cpu_s(services.pids["coordinator"])
        end = run.wait(lambda s: s.state in ("stopping", "done"), timeout_s, "the end")
        span = time.monotonic() - services.started
        coordinator_cpu = (cpu_s(services.pids["coordinator"]) - cpu) / span
        peak = rss_mb(services.pids["coordinator"], "VmHWM")
        counts = last_stats(services.stats)
        return {
            "tree": str(tree),
            "identities": identities,
            "reason": end.reason,
            "success": end.success,
            "detail": end.detail,
            "env_steps": end.env_steps,
            "seconds": span,
            "coordinator_cpu": coordinator_cpu,
            "coordinator_peak_rss_mb": peak,
            "coordinator_rss_before_mb": services.coordinator_rss_before,
            "assigned": counts.get("assigned"),
            "reports": counts.get("reports"),
        }
    finally:
        services.close()


def measure(root: Path, identities: int, window_s: float, timeout_s: float, tree: Path) -> dict[str, Any]:
    """One size, with the services and the simulated fleet of the rlmq checkout `tree`."""
    services = FleetAgainstServices(root, identities, tree, timeout_s, learner_metrics=True, total_steps=10**12)
    run, fleet, pids, stats = services.run, services.fleet, services.pids, services.stats
    coordinator_rss_before = services.coordinator_rss_before
    try:
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
        queued = learner_queue_depths(run.learner_metrics_target, before.at + window_s)
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
            "coordinator_rss_before_mb": coordinator_rss_before,
            "encoded_weights_bytes": after.counts["learner_weights_bytes"] / max(after.counts["learner_weights"], 1),
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
            "learner_queue_depth_mean": sum(queued) / len(queued) if queued else None,
            "learner_queue_depth_max": max(queued, default=None),
        }
    finally:
        services.close()


def learner_queue_depths(target: str, until: float) -> list[float]:
    """The learner's queue (rollouts received, not yet trained on), read from its metrics every
    QUEUE_SAMPLE_S until `until` (monotonic); a scrape that went unanswered is left out."""
    depths = []
    while time.monotonic() < until:
        scraped = scrape(target)
        if scraped is not None and "rlmq_learner_queue_depth" in scraped:
            depths.append(scraped["rlmq_learner_queue_depth"])
        time.sleep(QUEUE_SAMPLE_S)
    return depths


def package_dir(tree: Path) -> Path:
    """A directory in which `import rlmq` finds the checkout `tree`, ahead of the installed one on
    PYTHONPATH: the package laid out as pyproject.toml maps it (`rlmq` is api/, `rlmq.common`
    common/, ...), as the editable install's link tree does."""
    package = tree.parent / f".{tree.name}-as-package" / "rlmq"
    if not package.exists():
        package.mkdir(parents=True)
        for entry in (tree / "api").iterdir():
            (package / entry.name).symlink_to(entry.resolve())
        for sub in ("common", "actors", "learners", "coordinator", "cli", "configs"):
            (package / sub).symlink_to((tree / sub).resolve())
    return package.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--identities", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--baseline", type=Path, help="Another rlmq checkout, measured before this one.")
    parser.add_argument("--json", type=Path, help="Write the measurements here too.")
    parser.add_argument("--plot", type=Path, help="Draw the measurements against the model here (PNG).")
    parser.add_argument("--model-table", action="store_true", help="Instead: the model at 64, 1,000 and 10,000 actors.")
    parser.add_argument(
        "--to-target", action="store_true", help="Instead: train CartPole to 475 with each fleet, timed."
    )
    args = parser.parse_args()
    trees = [args.baseline.resolve(), ROOT] if args.baseline is not None else [ROOT]
    config = load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {})
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        if args.to_target:
            for n in args.identities:
                for i, tree in enumerate(trees):
                    print(json.dumps(to_target(Path(tmp) / f"target-{n}-{i}", n, args.timeout_s, tree)), flush=True)
            return
        costs = calibrate(Path(tmp) / "calibrate")
        print(json.dumps({"unit_costs": dataclasses.asdict(costs)}), flush=True)
        if args.model_table:
            for row in model_table(costs):
                print(json.dumps(row), flush=True)
            return
        for n in args.identities:
            for i, tree in enumerate(trees):
                before = tree != ROOT
                try:
                    result = measure(Path(tmp) / f"fleet-{n}-{i}", n, args.window_s, args.timeout_s, tree)
                except (AssertionError, SystemExit) as exc:  # the machine does not hold this fleet
                    print(f"{n} identities, {'before' if before else 'after'}: not measured: {exc}", flush=True)
                    continue
                result["label"] = "before" if before else "after"
                result["model"] = model(costs, result, config.report_interval_s, ACTOR_TIMEOUT_S, before)
                results.append(result)
                print(json.dumps(result), flush=True)
                print_row(result, "before" if before else "after")
    if args.json is not None:
        args.json.write_text(json.dumps({"unit_costs": dataclasses.asdict(costs), "runs": results}, indent=1))
    if args.plot is not None:
        plot(results, args.plot)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """The coordinator's CPU and reports per second against the fleet's size: measured points and
    the model's line, before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("coordinator CPU (cores)", lambda r: r["cpu"]["coordinator"], "coordinator_cpu"),
        ("actor reports / s at the coordinator", lambda r: r["reports_per_s"], "reports_per_s"),
        ("weights broadcast, MB/s", lambda r: r["broadcast_mb_per_s"], "broadcast_mb_per_s"),
    ]
    for axis, (title, measured, key) in zip(axes, panels, strict=True):
        for label, color in (("before", "tab:red"), ("after", "tab:blue")):
            runs = sorted((r for r in results if r["label"] == label), key=lambda r: r["identities"])
            if not runs:
                continue
            sizes = [r["identities"] for r in runs]
            axis.plot(sizes, [measured(r) for r in runs], "o", color=color, label=f"{label}: simulated")
            axis.plot(sizes, [r["model"][key] for r in runs], "-", color=color, label=f"{label}: model")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("actor identities")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def print_row(result: dict[str, Any], label: str) -> None:
    """Measured against modelled, and their ratio, for what the model predicts."""
    measured = {
        "reports_per_s": result["reports_per_s"],
        "coordinator_cpu": result["cpu"]["coordinator"],
        "redis_cpu": result["cpu"]["redis"],
        "coordinator_rss_mb": result["rss_mb"]["coordinator"],
        "broadcast_mb_per_s": result["broadcast_mb_per_s"],
        "credit_requests_per_s": result["credit_requests_per_s"],
        "learner_weights_mb_per_s": result["learner_weights_mb_per_s"],
    }
    print(f"{result['identities']} identities, {label}:")
    for key, value in measured.items():
        predicted = result["model"][key]
        ratio = value / predicted if predicted else float("nan")
        print(f"  {key:26s} measured {value:10.3f}  model {predicted:10.3f}  ratio {ratio:5.2f}")
    mean, most = result["learner_queue_depth_mean"], result["learner_queue_depth_max"]
    depth = "not read" if mean is None else f"mean {mean:.1f} rollouts (max {most:.0f})"
    print(f"  the learner's queue: {depth}; the coordinator's ack delay {result['ack_delay_ms']:.0f} ms")


if __name__ == "__main__":
    main()
