"""The run's learning curves as TensorBoard event files, written by the coordinator alone.

The coordinator hears every actor's episodes and every learner rank's statistics, so one process
writes the whole run's curves (a fleet of actors does not make a fleet of files). Each tick it
writes one point per tag at the run's env steps: the mean return and length of the episodes
counted since the last point, the actors' windowed mean, throughput, policy lag, the learners'
losses and statistics and the run's own evaluations. With a population, each member also gets a
run of its own (`member_M/`: its episodes, evaluations, hyperparameters and generation), and each
member's hyperparameters, from its start and after each PBT decision that changes them, are an
HParams session (`member_M/hparams_S/`, S the env steps where it starts), whose metric is the
member's windowed mean return.

Size stays bounded: points come at the tick's pace, not per episode, and past `max_bytes` the
coordinator writes no more (logged once). The `tensorboard` package is optional
(`rlmq[tensorboard]`); without it there are no curves, and one log line says how to get them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlmq.common.wire import LearnerReport
from rlmq.coordinator.records import RunStatus

log = logging.getLogger("rlmq.coordinator")

FLUSH_S = 2.0  # how stale the files on disk may be: TensorBoard's reader sees what is flushed
WINDOW_TAG = "episode/return_window_mean"  # the HParams sessions' metric
FILE_HEADER_BYTES = 64  # an event file's first record: its version


class Curves:
    """TensorBoard runs under `directory`: the whole run's, and one per member of a population."""

    def __init__(self, directory: Path, population: int, max_bytes: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary, self._writer_class = event_pb2.Event, summary_pb2.Summary, EventFileWriter
        self.directory, self.population, self.max_bytes = directory, population, max_bytes
        self.written = 0
        self._writers: dict[str, Any] = {}
        self._episodes: dict[int, list[tuple[float, int]]] = {}
        self._sessions: dict[int, tuple[int, int, dict[str, float]]] = {}  # member: (first step, generation, values)
        self._learned = {"updates": 0.0, "samples": 0.0, "update_s": 0.0, "stale_dropped": 0.0}
        self._losses: dict[str, float] = {}  # rank 0's last update's
        self._queued: dict[int, int] = {}  # rollouts queued, by rank
        self._since = time.monotonic()
        self._evaluated = (-1, -1, -1)  # the newest evaluation written: member, version, env steps
        self.add(0, {}, member=None)  # the run's directory exists from the start

    @classmethod
    def open(cls, directory: str, population: int, max_mb: float) -> Curves | None:
        """Curves in `directory`, or None: no directory given, or no `tensorboard` package."""
        if not directory:
            return None
        try:
            return cls(Path(directory), population, int(max_mb * 2**20))
        except ImportError:
            log.info("no TensorBoard curves: the tensorboard package is missing (pip install 'rlmq[tensorboard]')")
            return None

    def episodes(self, member: int, returns: Iterable[float], lengths: Iterable[int]) -> None:
        """Episodes counted for `member`, written as their means at the next tick."""
        self._episodes.setdefault(member, []).extend(zip(returns, lengths, strict=False))

    def learner_report(self, report: LearnerReport, publisher: bool) -> None:
        """A learner rank's statistics, written as rates and means at the next tick; the losses are
        the `publisher`'s (rank 0's socket: every rank's update is the same step of the same weights)."""
        for name in self._learned:
            self._learned[name] += getattr(report, name)
        self._queued[report.rank] = report.queue_depth
        if publisher and report.losses:
            self._losses = dict(report.losses)

    def tick(
        self,
        step: int,
        status: RunStatus,
        run: Mapping[str, float | None],
        members: Mapping[int, Mapping[str, float | None]],
        hyperparams: Mapping[int, tuple[int, Mapping[str, float]]],
    ) -> None:
        """One point per tag at `step` env steps: `run`'s scalars and the learners' in the run's
        directory, each member's in its own (a population's), the episodes counted since the last
        tick, the run's newest evaluation, and hyperparameters (generation, values) that start a
        new HParams session when they change."""
        together = [e for member in sorted(self._episodes) for e in self._episodes[member]]
        self.add(step, {**run, **_episode_means(together), **self._learners()}, member=None)
        self.evaluation(status)
        if self.population > 1:
            for member in range(self.population):
                scalars = {**members.get(member, {}), **_episode_means(self._episodes.get(member, []))}
                generation, values = hyperparams.get(member, (0, {}))
                scalars |= {f"hyperparameters/{k}": v for k, v in values.items()}
                scalars["pbt/generation"] = generation
                self.add(step, scalars, member=member)
                self._session(member, generation, dict(values), step, scalars.get(WINDOW_TAG))
        self._episodes.clear()

    def _learners(self) -> dict[str, float | None]:
        now = time.monotonic()
        elapsed, self._since = max(now - self._since, 1e-9), now
        learned, self._learned = self._learned, dict.fromkeys(self._learned, 0.0)
        scalars: dict[str, float | None] = {f"learner/{term}": v for term, v in self._losses.items()}
        scalars["learner/updates_per_s"] = learned["updates"] / elapsed
        scalars["learner/samples_per_s"] = learned["samples"] / elapsed
        scalars["learner/stale_dropped_per_s"] = learned["stale_dropped"] / elapsed
        scalars["learner/update_s"] = learned["update_s"] / learned["updates"] if learned["updates"] else None
        scalars["learner/queue_depth"] = float(sum(self._queued.values()))
        return scalars

    def evaluation(self, status: RunStatus) -> None:
        """The run's newest evaluation, once, at the env steps it was asked for."""
        which = (status.evaluated_member, status.evaluated_version, status.evaluated_at_steps)
        if which == self._evaluated or status.evaluated_return is None:
            return
        self._evaluated = which
        point = {"evaluation/return": status.evaluated_return, "evaluation/return_std": status.evaluated_std}
        self.add(status.evaluated_at_steps, point, member=None)
        if self.population > 1:
            self.add(status.evaluated_at_steps, point, member=status.evaluated_member)

    def add(self, step: int, scalars: Mapping[str, float | None], member: int | None, run: str = "") -> None:
        """Scalars at `step` in the run's directory, or `member`'s (`run` a directory under it)."""
        values = [
            self._summary.Value(tag=tag, simple_value=float(v))
            for tag, v in scalars.items()
            if v is not None and math.isfinite(v)
        ]
        if values or step == 0:
            self._write(self._run_name(member, run), self._event(step=step, summary=self._summary(value=values)))

    def _session(self, member: int, generation: int, values: dict[str, float], step: int, metric: float | None) -> None:
        """The member's current HParams session: a new one when its hyperparameters change; its
        metric, the member's windowed mean return, at each tick."""
        if not values:
            return
        if self._sessions.get(member, (0, 0, {}))[1:] != (generation, values):
            self._sessions[member] = (step, generation, values)  # named by its first step: unique across restarts
            from rlmq.coordinator.hparams import experiment, session_start

            run = f"hparams_{step}"

            for summary in (experiment(values, WINDOW_TAG), session_start(values, f"member_{member}")):
                self._write(self._run_name(member, run), self._event(step=step, summary=summary))
        self.add(step, {WINDOW_TAG: metric}, member=member, run=f"hparams_{self._sessions[member][0]}")

    def _run_name(self, member: int | None, run: str) -> str:
        name = "" if member is None else f"member_{member}"
        return f"{name}/{run}" if run else name

    def _write(self, name: str, event: Any) -> None:
        event.wall_time = time.time()
        writer = self._writers.get(name)
        # the record's length and CRCs; a new file also starts with a version record
        size = event.ByteSize() + 16 + (FILE_HEADER_BYTES if writer is None else 0)
        if self.written + size > self.max_bytes:
            if self.written <= self.max_bytes:
                log.warning(
                    "TensorBoard curves reached their size bound (%.1f MiB): no more are written "
                    "(raise tensorboard_max_mb)",
                    self.max_bytes / 2**20,
                )
                self.written = self.max_bytes + 1
            return
        if writer is None:
            writer = self._writers[name] = self._writer_class(str(self.directory / name), flush_secs=FLUSH_S)
        writer.add_event(event)
        self.written += size

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def _episode_means(episodes: list[tuple[float, int]]) -> dict[str, float | None]:
    if not episodes:
        return {}
    return {
        "episode/return": sum(r for r, _ in episodes) / len(episodes),
        "episode/length": sum(n for _, n in episodes) / len(episodes),
    }
