"""A CartPole run to 475 with and without a crowd of identities that ask for credit and never send a
rollout (issue 41): how much longer the crowd makes the run.

For each seed, one after the other: separate services on this host (tests/helpers/fleet_run.py: a
private Redis, the coordinator, one learner, `--actors` actors, every socket on CURVE, the keys
directory holding the fleet's key), configs/ppo-cartpole.toml with a target of 475 (the run's own
evaluation decides it). Once without the crowd, once with `--identities` sockets holding the
fleet's key, each a new actor name, renewing a request for credit every 0.25 s from the run's first
env step on (with `--before-actors`, from the learner's start, the actors 8 s later: every
actor a newcomer behind the crowd). Time to target: from the actors' start (their processes
launched) to the coordinator's `ended_at`, so that the time newcomers wait for a first credit counts.

Prints each pair and the ratio of the median times (target ≤ 2).

    python benchmarks/bench_credit_flood.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlmq.common.loading import load_run_config  # noqa: E402
from tests.helpers.fleet_run import FleetRun, Flood  # noqa: E402

CROWD_FIRST_S = 8.0  # with --before-actors: the learner is up and the crowd asking before the actors start


def time_to_target(
    root: Path, seed: int, actors: int, identities: int, timeout_s: float, before_actors: bool
) -> tuple[float, int]:
    config = dataclasses.replace(
        load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {}),
        target_return=475.0,
        seed=seed,
        total_steps=2_000_000,
    )
    run = FleetRun(root, config, actors, start_actors=not before_actors)
    try:
        flood = Flood(run.keys, run.experience, identities) if identities else contextlib.nullcontext()
        if not before_actors:
            run.wait(lambda s: s.first_step_at is not None, 120, "the first env step")
        with flood:
            if before_actors:  # the crowd asks first: every actor comes after it, a newcomer
                time.sleep(CROWD_FIRST_S)
                run.start_actors()
            status = run.wait(lambda s: s.state in ("stopping", "done"), timeout_s, "the target")
        assert status.success and status.ended_at is not None, status
        return status.ended_at - run.actors_started_at, status.env_steps_at_end or status.env_steps
    finally:
        run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--identities", type=int, default=200)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--before-actors",
        action="store_true",
        help="the crowd comes first: the actors start 5 s after the learner, the crowd with it",
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-credit-flood-") as tmp:
        for seed in args.seeds:
            for identities in (0, args.identities):
                started = time.strftime("%H:%M:%S")
                wall, steps = time_to_target(
                    Path(tmp) / f"s{seed}-{identities}",
                    seed,
                    args.actors,
                    identities,
                    args.timeout_s,
                    args.before_actors,
                )
                rows.append((seed, identities, wall, steps))
                print(
                    f"{started} seed {seed}, {identities:3d} identities: 475 in {wall:5.1f} s, {steps:,} env steps",
                    flush=True,
                )
    alone = statistics.median(w for _, n, w, _ in rows if n == 0)
    crowded = statistics.median(w for _, n, w, _ in rows if n)
    print(
        f"\nmedian time to 475: {alone:.1f} s alone, {crowded:.1f} s with {args.identities} identities: "
        f"{crowded / alone:.2f}x (target <= 2)"
    )


if __name__ == "__main__":
    main()
