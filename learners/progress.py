"""What a learner rank has done since its last report: updates, samples, the policy lag of what it
trained on, the rollouts it dropped, the last losses, and the steps its trainer skipped for a
non-finite gradient. Each event moves its metric at once; `report` hands the tallies to the
coordinator as one `LearnerReport` and starts them afresh, so that no event is counted twice.
"""

from __future__ import annotations

import collections
import logging
import math
import time

import numpy as np

from rlmq.common import wire
from rlmq.common.metrics import LearnerMetrics
from rlmq.learners.deliveries import Deliveries
from rlmq.learners.members import MemberQueues, Taken

log = logging.getLogger("rlmq.learner")
NONFINITE_LOG_EVERY = 100  # skipped steps between two log lines about them (the first is logged)
IDLE_WARNING_S = 60.0  # how often identities that hold credit requests and never use them are logged


class Progress:
    def __init__(self, name: str, rank: int, metrics: LearnerMetrics) -> None:
        self.name, self.rank, self.metrics = name, rank, metrics
        self.counts = collections.Counter[str]()
        self.losses: dict[str, float] = {}  # the last update's
        self.update_s = 0.0  # seconds in updates
        self.lags: list[int] = []
        self.nonfinite_seen = 0  # member steps the trainer skipped for a non-finite gradient, ever
        self.idle_warned_at = -IDLE_WARNING_S

    def rejected(self) -> None:
        self.counts["rejected"] += 1

    def dropped_stale(self, rollouts: int) -> None:
        self.counts["stale"] += rollouts
        self.metrics.stale_dropped.inc(rollouts)

    def updated(self, taken: Taken, losses: dict[str, float], seconds: float) -> None:
        """One update of the members in `taken`, which gave `losses`, in `seconds`."""
        self.update_s += seconds
        self.metrics.update_seconds.observe(seconds)
        for term, value in losses.items():
            self.metrics.loss.labels(term).set(value)
        self.losses = {term: value for term, value in losses.items() if math.isfinite(value)}
        for lag in taken.lags:
            self.metrics.policy_lag.observe(lag)
        self.lags += taken.lags
        samples = sum(r.num_steps for rollouts in taken.rollouts for r in rollouts)
        self.counts["updates"] += 1
        self.counts["samples"] += samples
        self.metrics.updates.inc()
        self.metrics.samples.inc(samples)

    def nonfinite(self, skipped: int) -> None:
        """The trainer has skipped `skipped` member steps so far for a non-finite gradient: the
        new ones to the metric and the report, and a log line (the first, then one per
        NONFINITE_LOG_EVERY)."""
        new = skipped - self.nonfinite_seen
        if new <= 0:
            return
        if self.nonfinite_seen == 0 or skipped // NONFINITE_LOG_EVERY > self.nonfinite_seen // NONFINITE_LOG_EVERY:
            log.warning(
                "skipped %d member step(s) whose gradient was not finite (%d so far); the weights keep "
                "their values. If this keeps happening, check the env's rewards and observations "
                "(docs/architecture.md, non-finite updates)",
                new,
                skipped,
            )
        self.nonfinite_seen = skipped
        self.metrics.nonfinite_skipped.inc(new)
        self.counts["nonfinite"] += new

    def report(
        self, members: MemberQueues, deliveries: Deliveries, applied_decision: int, final: bool
    ) -> wire.LearnerReport:
        """The tallies since the last report, as the coordinator reads them; the tallies start afresh."""
        lags, self.lags = self.lags, []
        update_s, self.update_s = self.update_s, 0.0
        steps, episodes = deliveries.take()
        idle = members.idle_requests()
        self.metrics.idle_requests.set(idle)
        if idle and time.monotonic() - self.idle_warned_at >= IDLE_WARNING_S:
            self.idle_warned_at = time.monotonic()
            log.warning(
                "%d identities hold credit requests and send no rollout (a stolen actor key, or actors "
                "that cannot collect): they wait behind every actor that delivers",
                idle,
            )
        return wire.LearnerReport(
            name=self.name,
            rank=self.rank,
            policy_version=max(members.versions),
            updates=self.counts.pop("updates", 0),
            samples=self.counts.pop("samples", 0),
            stale_dropped=self.counts.pop("stale", 0),
            rejected=self.counts.pop("rejected", 0),
            mean_policy_lag=float(np.mean(lags)) if lags else 0.0,
            applied_decision=applied_decision,
            nonfinite_skipped=self.counts.pop("nonfinite", 0),
            session=deliveries.session,
            delivered_steps=steps,
            delivered_episodes=episodes,
            final=final,
            idle_requests=idle,
            losses=self.losses,
            queue_depth=members.queued,
            update_s=update_s,
        )
