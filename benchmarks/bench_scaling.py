"""Scaling: env steps/s and time to a return threshold for a grid of actors × learners (× device),
through `rlmq up` on whatever machine this runs on, and where each run's bottleneck sits.

For each cell of `--grid` (`AxL`: A actors, L learners) and each of `--devices`, one
`rlmq up --actors A --learners L --env ENV --algo ALGO --device D --target-return T --total-steps B`
(the shipped config for the env and algorithm unless `--config`), one cell after the other. While a
run trains, every process `rlmq up` lists for Prometheus (`prometheus_targets.json`) is scraped
every `--scrape-s`; the rates below are the differences between the first scrape with env steps
and the last one before the end, so start-up and shutdown stay out of them:

    env steps/s       the actors' `rlmq_actor_env_steps_total`, summed
    efficiency        env steps/s ÷ (A × the 1-actor cell's with the same learners and device)
    learner busy      the fraction of wall time the learners spent in updates (`update_seconds`)
    credit wait       the fraction of an actor's time spent waiting for a learner's credit
    acting, env wait  the fractions of an actor's time spent choosing actions and waiting for its envs
    queue             rollouts waiting at the learners, mean over the scrapes
    batch             env steps a learner trains on per update (grows with the fleet when the config
                      lets the batch grow: `ppo.max_rollouts_per_batch`)
    lag               mean policy lag of the rollouts trained on (updates)
    to target         `summary.json`'s train_wall_s when the run reached `--target-return`

and a guess at the bottleneck: "learner" when the learners are busy ≥ 80 % of the time, "credits"
when the actors wait for credits ≥ 50 % of theirs while the learners are not (too few rollouts
in flight for the fleet), "actors" when neither waits (envs and policies are the limit).

    python benchmarks/bench_scaling.py --grid 1x1 2x1 4x1 2x2 --env CartPole-v1 --algo ppo \\
        --target-return 475 --total-steps 2000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

Scrape = dict[str, float]  # sample name → value, summed over the process's label sets


@dataclass
class Scrapes:
    """Each role's scrapes over time: (time, [one `Scrape` per process of that role])."""

    by_role: dict[str, list[tuple[float, list[Scrape]]]] = field(default_factory=dict)

    def add(self, role: str, at: float, scrapes: list[Scrape]) -> None:
        self.by_role.setdefault(role, []).append((at, scrapes))

    def total(self, role: str, sample: str, index: int) -> tuple[float, float]:
        """(time, `sample` summed over the role's processes) at the `index`-th scrape."""
        at, scrapes = self.by_role[role][index]
        return at, sum(s.get(sample, 0.0) for s in scrapes)


def scrape(target: str) -> Scrape | None:
    try:
        text = urllib.request.urlopen(f"http://{target}/metrics", timeout=1).read().decode()
    except OSError:  # not serving yet, or gone
        return None
    values: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def scrape_run(run_dir: Path) -> dict[str, list[Scrape]]:
    """One scrape of every process of the run, by role; {} before the targets file exists."""
    try:
        groups = json.loads((run_dir / "prometheus_targets.json").read_text())
    except (OSError, ValueError):
        return {}
    found: dict[str, list[Scrape]] = {}
    for group in groups:
        got = [s for s in (scrape(t) for t in group["targets"]) if s is not None]
        if len(got) == len(group["targets"]):  # all of the role, or none: sums must be like for like
            found[group["labels"]["role"]] = got
    return found


def run_cell(args: argparse.Namespace, actors: int, learners: int, device: str, run_dir: Path) -> dict[str, object]:
    argv = [
        sys.executable,
        "-m",
        "rlmq.cli",
        "up",
        "--actors",
        str(actors),
        "--learners",
        str(learners),
        "--env",
        args.env,
        "--algo",
        args.algo,
        "--device",
        device,
        "--seed",
        str(args.seed),
        "--total-steps",
        str(args.total_steps),
        "--run-dir",
        str(run_dir),
    ]
    if args.target_return is not None:
        argv += ["--target-return", str(args.target_return)]
    if args.config:
        argv += ["--config", str(args.config)]
    argv += getattr(args, "up_args", [])  # bench_atari.py's
    scrapes = Scrapes()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "wb") as log:
        up = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + args.timeout_s
        while up.poll() is None and time.monotonic() < deadline:
            at, found = time.monotonic(), scrape_run(run_dir)
            if "actor" in found and "learner" in found:
                for role in ("actor", "learner"):
                    scrapes.add(role, at, found[role])
            time.sleep(args.scrape_s)
        if up.poll() is None:
            up.terminate()
        up.wait(timeout=60)
    return {"exit": up.returncode, **rates(scrapes), **outcome(run_dir)}


def rates(scrapes: Scrapes) -> dict[str, float]:
    """The cell's rates between the first scrape with env steps and the last (module docstring)."""
    actor_scrapes = scrapes.by_role.get("actor", [])
    first = next(
        (i for i in range(len(actor_scrapes)) if scrapes.total("actor", "rlmq_actor_env_steps_total", i)[1] > 0), None
    )
    if first is None or len(actor_scrapes) - first < 3:
        return {}
    last = len(actor_scrapes) - 1
    learner_scrapes = scrapes.by_role["learner"]

    def per_s(role: str, sample: str) -> float:
        (t0, v0), (t1, v1) = scrapes.total(role, sample, first), scrapes.total(role, sample, last)
        return (v1 - v0) / (t1 - t0)

    actors, learners = len(actor_scrapes[last][1]), len(learner_scrapes[last][1])
    lag_count = per_s("learner", "rlmq_learner_policy_lag_count")
    updates = per_s("learner", "rlmq_learner_updates_total")
    return {
        "env_steps_per_s": per_s("actor", "rlmq_actor_env_steps_total"),
        "learner_busy": per_s("learner", "rlmq_learner_update_seconds_sum") / learners,
        "credit_wait": per_s("actor", "rlmq_actor_credit_wait_seconds_total") / actors,
        "acting": per_s("actor", "rlmq_actor_acting_seconds_total") / actors,
        "env_wait": per_s("actor", "rlmq_actor_env_wait_seconds_total") / actors,
        "queue": statistics.mean(
            scrapes.total("learner", "rlmq_learner_queue_depth", i)[1] for i in range(first, last + 1)
        ),
        "lag": per_s("learner", "rlmq_learner_policy_lag_sum") / lag_count if lag_count else float("nan"),
        "batch": per_s("learner", "rlmq_learner_samples_total") / updates if updates else float("nan"),
    }


def outcome(run_dir: Path) -> dict[str, object]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return {
        "reached": summary.get("reason") == "target",
        "train_wall_s": summary.get("train_wall_s"),
        "return": summary.get("mean_return_last_100"),
        "env_steps": summary.get("env_steps"),
    }


def bottleneck(cell: dict[str, object]) -> str:
    busy, wait = cell.get("learner_busy"), cell.get("credit_wait")
    if not isinstance(busy, float) or not isinstance(wait, float):
        return "?"
    if busy >= 0.8:
        return "learner"
    return "credits" if wait >= 0.5 else "actors"


def grid_cell(text: str) -> tuple[int, int]:
    actors, _, learners = text.partition("x")
    return int(actors), int(learners)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=grid_cell, nargs="+", default=[(1, 1), (2, 1), (4, 1), (2, 2)])
    parser.add_argument("--devices", nargs="+", default=["cpu"])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--target-return", type=float, default=475.0)
    parser.add_argument("--total-steps", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scrape-s", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument(
        "--out-dir", type=Path, default=Path("runs") / f"bench-scaling-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cells: dict[tuple[int, int, str], dict[str, object]] = {}
    for device in args.devices:
        for actors, learners in args.grid:
            run_dir = args.out_dir / f"{actors}x{learners}-{device}"
            cells[actors, learners, device] = run_cell(args, actors, learners, device, run_dir)
            print(f"{actors}x{learners} {device}: {cells[actors, learners, device]}", flush=True)
    print(f"\n{args.env}, {args.algo}, target {args.target_return}, budget {args.total_steps:,} env steps\n")
    print(
        "| actors × learners | device | env steps/s | efficiency | learner busy | credit wait | "
        "queue | batch | lag | "
        "to target s | return | bottleneck |\n|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|:--|"
    )
    for (actors, learners, device), cell in cells.items():
        rate = cell.get("env_steps_per_s")
        one = cells.get((1, learners, device), {}).get("env_steps_per_s")
        efficiency = f"{rate / (actors * one):.2f}" if isinstance(rate, float) and isinstance(one, float) else "—"
        to_target = f"{cell['train_wall_s']:.1f}" if cell.get("reached") else "not reached"

        def show(key: str, form: str, cell: dict[str, object] = cell) -> str:
            value = cell.get(key)
            return format(value, form) if isinstance(value, float | int) else "—"

        print(
            f"| {actors} × {learners} | {device} | {show('env_steps_per_s', ',.0f')} | {efficiency} | "
            f"{show('learner_busy', '.2f')} | {show('credit_wait', '.2f')} | {show('queue', '.1f')} | "
            f"{show('batch', ',.0f')} | "
            f"{show('lag', '.1f')} | {to_target} | {show('return', '.1f')} | {bottleneck(cell)} |"
        )
    if args.json:
        args.json.write_text(json.dumps({f"{a}x{n}-{d}": c for (a, n, d), c in cells.items()}, indent=1))


if __name__ == "__main__":
    main()
