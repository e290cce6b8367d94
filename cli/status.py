"""`rlmq status`: what a run is doing, read from Redis."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import redis

from rlmq.common.service import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from rlmq.coordinator.store import RunStore


def show_status(run_dir: Path, redis_url: str | None, run: str | None) -> int:
    if redis_url is None or run is None:
        info_path = run_dir / "run.json"
        if not info_path.exists():
            print(f"error: no run at {run_dir} (no run.json); pass --run-dir of an `rlmq up` run, "
                  "or --redis-url and --run", file=sys.stderr)
            return EXIT_USAGE
        info = json.loads(info_path.read_text())
        redis_url, run = redis_url or info["redis_url"], run or info["run"]
    store = RunStore.connect(redis_url, run)
    try:
        status = store.status()
        learners = store.learners()
    except redis.ConnectionError:
        print(f"error: cannot reach Redis at {redis_url}: is the run still up?", file=sys.stderr)
        return EXIT_FAILED
    if not status:
        print(f"error: Redis at {redis_url} holds no run {run!r}", file=sys.stderr)
        return EXIT_USAGE
    config = store.load_config()
    print(f"run {run}  state {status.get('state')}  {status.get('detail') or ''}")
    if config is not None:
        rc, spec = config
        print(f"  {rc.algo} on {rc.env_id} ({spec.action_kind} actions, obs {spec.obs_dim}); "
              f"target {rc.target_return}, budget {rc.total_steps:,} env steps")
    mean = status.get("mean_return")
    print(f"  env steps {int(status.get('env_steps', 0)):,}  ({float(status.get('steps_per_s', 0)):,.0f}/s)  "
          f"episodes {int(status.get('episodes', 0)):,}  mean return (last 100) "
          f"{'—' if mean is None else f'{mean:.1f}'}")
    print(f"  policy version {status.get('policy_version', 0)}  policy lag {float(status.get('policy_lag', 0)):.1f}  "
          f"actors {status.get('actors', 0)}  learners {len(learners)}")
    updated = status.get("updated_at")
    if updated is not None:
        print(f"  updated {time.time() - float(updated):.1f} s ago")
    return EXIT_OK
