"""The run directory: config, final checkpoint (atomic), metrics CSV, summary JSON, learning curve;
with a population also the PBT lineage (lineage.json, lineage.png)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlmq.cli import figures
from rlmq.common import wire
from rlmq.common.architecture import activation_code
from rlmq.common.config import RunConfig
from rlmq.common.redis_urls import with_password
from rlmq.common.schema import EnvSpec
from rlmq.coordinator import cem
from rlmq.coordinator.records import (
    LoggedDecision,
    LoggedDiversityWeight,
    LoggedGeneration,
    MemberRecord,
    ProgressSample,
    RunStatus,
)
from rlmq.coordinator.store import RunStore
from rlmq.learners.policy_file import MemberPolicy, PolicyRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CSV_FIELDS = ("time", "env_steps", "episodes", "mean_return", "steps_per_s", "policy_lag")


def run_redis_of(run_dir: Path) -> tuple[str, str]:
    """(the Redis URL of the run in `run_dir`, with its password if it has one; the run id), from
    the run.json `rlmq up` writes. OSError, KeyError or ValueError when there is none to read."""
    info = json.loads((run_dir / "run.json").read_text())
    return with_password(info["redis_url"], info.get("redis_password_file", "")), str(info["run"])


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
    try:
        yield tmp
    except BaseException:  # a write that failed (a full disk) leaves no half file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _played_with(hyperparams: dict[str, float], weights: wire.Weights) -> dict[str, float]:
    """A member record's hyperparameters with the activation its weights were published under: a
    decision the record already holds may not have reached the published weights yet."""
    if not weights.activation:
        return hyperparams
    return {**hyperparams, "activation": activation_code(weights.activation)}


def write_checkpoint(path: Path, store: RunStore, spec: EnvSpec, run_config: RunConfig) -> int | None:
    """Every member's latest published weights as the policy record (learners/policy_file.py);
    the best member's version."""
    published = {m: w for m in range(run_config.population) if (w := store.weights(m)) is not None}
    return save_checkpoint(path, published, store.status().best_member, store.members(), spec, run_config)


def write_mean_actor(path: Path, store: RunStore, spec: EnvSpec, run_config: RunConfig) -> None:
    """CEM-RL's answer: the mean of its last search distribution, as the actor of a policy record
    of one member (`rlmq eval RUN_DIR/mean.pt`)."""
    applied, like = store.applied_decision(), store.weights(0)
    dist = store.distribution(applied) if applied else None
    if dist is None or like is None:
        return
    mean = wire.Weights(member=0, version=applied, params=cem.unflatten(dist.mean, dict(like.params)))
    save_checkpoint(path, {0: mean}, 0, {}, spec, run_config)


def save_checkpoint(
    path: Path,
    published: dict[int, wire.Weights],
    best: int,
    records: dict[int, MemberRecord],
    spec: EnvSpec,
    run_config: RunConfig,
) -> int | None:
    """`write_checkpoint` from weights and member records in hand; the best member's version."""
    if not published:
        return None
    import torch  # only here: `rlmq up` itself stays light until the run is over

    if best not in published:  # no weights of its own in Redis yet: still keep a policy
        best = min(published)
    unknown = MemberRecord(hyperparams={})  # a member Redis has no record of (yet)
    record = PolicyRecord(
        members={
            m: MemberPolicy(
                params=weights.params,
                version=weights.version,
                trained_steps=weights.trained_steps,
                hyperparams=_played_with(records.get(m, unknown).hyperparams, weights),
                generation=records.get(m, unknown).generation,
                parent=records.get(m, unknown).parent,
            )
            for m, weights in published.items()
        },
        best_member=best,
        env_spec=spec,
        run_config=run_config,
    )
    with atomic(path) as tmp:
        try:
            torch.save(record.to_state(), tmp)
        except RuntimeError as exc:  # torch's zip writer reports a failed write so
            raise OSError(errno.EIO, f"could not write {path}") from exc
    return published[best].version


def write_csv(path: Path, progress: list[ProgressSample], population: int = 1) -> None:
    """One row per progress sample; with a population, also each member's recent mean return."""
    member_fields = [f"member_{m}" for m in range(population)] if population > 1 else []
    rows = [
        {
            **dataclasses.asdict(sample),
            **{f"member_{m}": sample.members.get(str(m)) for m in range(population)},
        }
        for sample in progress
    ]
    with atomic(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*CSV_FIELDS, *member_fields], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def save_figure(path: Path, fig: Figure) -> None:
    with atomic(path) as tmp:
        fig.savefig(tmp)
    figures.pyplot().close(fig)


def write_lineage(path: Path, decisions: Sequence[LoggedDecision | LoggedGeneration | LoggedDiversityWeight]) -> None:
    """The PBT decision log (CEM-RL's generations, DvD's weights), oldest first, as the coordinator logged it:
    the lineage without the plot. `run_env_steps` (the run's env steps when it was taken) is where it
    stands in lineage.png."""
    with atomic(path) as tmp:
        tmp.write_text(json.dumps([dataclasses.asdict(d) for d in decisions], indent=2, sort_keys=True))


def member_summaries(store: RunStore, population: int) -> list[dict[str, Any]]:
    records, steps = store.members(), store.member_steps()
    summaries = []
    for member in range(population):
        record, recent = records.get(member, MemberRecord(hyperparams={})), store.recent_returns(member)
        summaries.append(
            {
                "member": member,
                "generation": record.generation,
                "parent": record.parent,
                "env_steps": steps.get(member, 0),
                "mean_return_last_100": sum(recent) / len(recent) if recent else None,
                "hyperparams": record.hyperparams,
            }
        )
    return summaries


def write_results(
    run_dir: Path,
    store: RunStore,
    spec: EnvSpec,
    run_config: RunConfig,
    launched: float,
    outcome: str,
) -> dict[str, Any]:
    status = store.status()
    progress = store.progress()
    population = run_config.population
    title = run_title(run_config)
    version = write_checkpoint(run_dir / "checkpoint.pt", store, spec, run_config)
    write_curves(run_dir, progress, run_config)
    if population > 1 and run_config.method == "cem":
        generations = store.generations()
        write_lineage(run_dir / "lineage.json", generations)
        save_figure(run_dir / "lineage.png", figures.generations_figure(generations, population, f"CEM-RL: {title}"))
        write_mean_actor(run_dir / "mean.pt", store, spec, run_config)
    elif population > 1 and run_config.method == "dvd":
        weights = store.diversity_weights()
        write_lineage(run_dir / "lineage.json", weights)
        if weights:
            save_figure(run_dir / "lineage.png", figures.diversity_weight_figure(weights, f"DvD's weight: {title}"))
    elif population > 1:
        decisions = store.decisions()
        write_lineage(run_dir / "lineage.json", decisions)
        end_steps = float(status.env_steps)
        save_figure(
            run_dir / "lineage.png",
            figures.lineage_figure(decisions, population, end_steps, f"PBT lineage: {title}"),
        )
    summary = summarize(
        store.run,
        outcome,
        status,
        run_config,
        launched,
        policy_version=version,
        members=member_summaries(store, population),
        pbt_decisions=store.applied_decision(),
    )
    write_summary(run_dir / "summary.json", summary)
    return summary


def write_last_seen(
    run_dir: Path,
    run: str,
    status: RunStatus,
    progress: list[ProgressSample],
    run_config: RunConfig,
    launched: float,
    outcome: str,
    spec: EnvSpec,
    weights: dict[int, wire.Weights],
    records: dict[int, MemberRecord],
) -> dict[str, Any]:
    """For a run whose Redis is gone at the end: checkpoint.pt, metrics.csv, the learning curve and
    summary.json from what `rlmq up` read while Redis answered (the weights it last read, up to
    run_redis.LastSeen.WEIGHTS_EVERY looks old). No lineage (the PBT log lives in Redis only); summary.json
    says `"redis_unreachable": true`."""
    version = save_checkpoint(run_dir / "checkpoint.pt", weights, status.best_member, records, spec, run_config)
    write_curves(run_dir, progress, run_config)
    summary = summarize(
        run,
        outcome,
        status,
        run_config,
        launched,
        policy_version=version,
        members=[],
        pbt_decisions=status.pbt_decisions,
        redis_unreachable=True,
    )
    write_summary(run_dir / "summary.json", summary)
    return summary


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    with atomic(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2))


def run_title(run_config: RunConfig) -> str:
    population = run_config.population
    return f"{run_config.algo} on {run_config.env_id}" + (f", population {population}" if population > 1 else "")


def write_curves(run_dir: Path, progress: list[ProgressSample], run_config: RunConfig) -> None:
    """metrics.csv and learning_curve.png from the progress samples."""
    population = run_config.population
    write_csv(run_dir / "metrics.csv", progress, population)
    curve = figures.learning_curve(progress, run_title(run_config), run_config.target_return, population)
    save_figure(run_dir / "learning_curve.png", curve)


def summarize(
    run: str,
    outcome: str,
    status: RunStatus,
    run_config: RunConfig,
    launched: float,
    *,
    policy_version: int | None,
    members: list[dict[str, Any]],
    pbt_decisions: int,
    redis_unreachable: bool = False,
) -> dict[str, Any]:
    """summary.json: the run's end as its status in Redis recorded it."""
    first_step = status.first_step_at
    ended = status.ended_at or time.time()
    return {
        "run": run,
        "outcome": outcome,
        "reason": status.reason or None,
        "detail": status.detail or None,
        "success": status.success,
        # Counted when the run ended; actors winding down add a few more to `env_steps`.
        "env_steps": status.env_steps if status.env_steps_at_end is None else status.env_steps_at_end,
        "episodes": status.episodes,
        "mean_return_last_100": status.mean_return,  # the best member's, as its actors reported them
        # The run's own latest evaluation (coordinator/judge.py): the verdict on the target.
        "evaluation": None
        if status.evaluated_return is None
        else {
            "member": status.evaluated_member,
            "version": status.evaluated_version,
            "mean_return": status.evaluated_return,
            "std": status.evaluated_std,
            "episodes": status.evaluated_episodes,
            "deterministic": status.evaluated_deterministic,
            "at_env_steps": status.evaluated_at_steps,
            "evaluations": status.evaluations,
        },
        "policy_version": policy_version,  # the best member's (checkpoint "params")
        "population": run_config.population,
        "best_member": status.best_member,
        "pbt_decisions": pbt_decisions,
        "members": members,
        "startup_s": None if first_step is None else first_step - launched,
        "train_wall_s": None if first_step is None else ended - first_step,
        "total_wall_s": ended - launched,
        # True: Redis was gone at the end; the rest is what `rlmq up` last read from it
        "redis_unreachable": redis_unreachable,
        "run_config": dataclasses.asdict(run_config),
    }
