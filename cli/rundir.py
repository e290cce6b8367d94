"""The run directory: config, final checkpoint (atomic), metrics CSV, summary JSON, learning curve."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlmq.common.config import EnvSpec, RunConfig
from rlmq.coordinator.store import RunStore

CSV_FIELDS = ("time", "env_steps", "episodes", "mean_return", "steps_per_s", "policy_lag")


def point_latest(run_dir: Path) -> None:
    """`runs/latest` → this run, so that `rlmq status` finds it without flags."""
    latest = run_dir.parent / "latest"
    try:
        if latest.is_symlink() or not latest.exists():
            tmp = run_dir.parent / f".latest-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(run_dir.resolve())
            os.replace(tmp, latest)
    except OSError:
        pass  # a read-only or odd parent: `rlmq status --run-dir` still works


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """Write to the yielded temporary path; it replaces `path` only once the write is complete,
    so a run killed mid-write leaves the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    yield tmp
    os.replace(tmp, path)


def write_checkpoint(path: Path, store: RunStore, spec: EnvSpec, run_config: RunConfig) -> int | None:
    """The latest published weights as a torch checkpoint (load with weights_only=True)."""
    weights = store.weights(0)
    if weights is None:
        return None
    import torch  # only here: `rlmq up` itself stays light until the run is over

    state = {
        "params": {k: torch.from_numpy(v.copy()) for k, v in weights.params.items()},
        "version": weights.version,
        "env_spec": dataclasses.asdict(spec),
        "run_config": json.loads(json.dumps(dataclasses.asdict(run_config))),
    }
    with atomic(path) as tmp:
        torch.save(state, tmp)
    return weights.version


def write_csv(path: Path, progress: list[dict[str, Any]]) -> None:
    with atomic(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(progress)


def plot_curve(path: Path, progress: list[dict[str, Any]], title: str, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(p["env_steps"], p["mean_return"]) for p in progress if p.get("mean_return") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if points:
        ax.plot(*zip(*points, strict=True), label="mean return (last 100 episodes)")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def write_results(run_dir: Path, store: RunStore, spec: EnvSpec, run_config: RunConfig,
                  launched: float, outcome: str) -> dict[str, Any]:
    status = store.status()
    progress = store.progress()
    version = write_checkpoint(run_dir / "checkpoint.pt", store, spec, run_config)
    write_csv(run_dir / "metrics.csv", progress)
    plot_curve(run_dir / "learning_curve.png", progress, f"{run_config.algo} on {run_config.env_id}",
               run_config.target_return)
    first_step = status.get("first_step_at")
    ended = status.get("ended_at") or time.time()
    summary = {
        "run": store.run,
        "outcome": outcome,
        "reason": status.get("reason"),
        "detail": status.get("detail"),
        "success": bool(status.get("success")),
        # Counted when the run ended; actors winding down add a few more to `env_steps`.
        "env_steps": int(status.get("env_steps_at_end", status.get("env_steps", 0))),
        "episodes": int(status.get("episodes", 0)),
        "mean_return_last_100": status.get("mean_return"),
        "policy_version": version,
        "startup_s": None if first_step is None else first_step - launched,
        "train_wall_s": None if first_step is None else ended - first_step,
        "total_wall_s": ended - launched,
        "run_config": dataclasses.asdict(run_config),
    }
    with atomic(run_dir / "summary.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2))
    return summary
