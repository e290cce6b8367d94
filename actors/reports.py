"""What an actor tells the coordinator: env steps, episodes and their returns, kept as totals.

Each report holds the actor's totals so far and every finished episode the coordinator has not
acknowledged; the coordinator counts what the totals add, once, however often a report comes. So
while the coordinator is away nothing is lost: reports go on, and the first one it reads after
counts everything since. Metrics are updated here, once per report, off the actor's hot path.
No sockets here: the actor sends the reports and hands back the acknowledgements.
"""

from __future__ import annotations

import random

import numpy as np

from rlmq.actors.unacked import UnackedEpisodes
from rlmq.common import wire
from rlmq.common.metrics import ActorMetrics
from rlmq.common.service import RateTimer

MAX_UNACKED_RETURNS = 4096  # returns kept for a coordinator that is away; beyond, the oldest are given up
# At the end, how long to wait for the last report to be counted: a connection to the coordinator
# redialled after a partition takes up to transport.CONNECT_TIMEOUT_MS and a handshake.
FINAL_ACK_WAIT_S = 2.0
FINAL_RESEND_S = 0.25


class Reports:
    def __init__(self, name: str, member: int, metrics: ActorMetrics, interval_s: float) -> None:
        self.name, self.member, self.metrics = name, member, metrics
        self.run_interval_s = interval_s  # the run's report_interval_s
        self.timer = RateTimer(interval_s)  # its period: as the coordinator last asked
        self.session = random.SystemRandom().getrandbits(40)  # names this process's totals to the coordinator
        self.totals = (0, 0)  # env steps and episodes so far
        self.acked = (0, 0)  # the totals the coordinator says it has heard
        self.uncounted = (0, 0)  # of those, the env steps and episodes it does not count yet (a secure run)
        self.unacked = UnackedEpisodes(MAX_UNACKED_RETURNS)
        self.unreported_steps = 0
        self.unreported_credit_wait = 0.0  # seconds
        self.first_step_at = 0.0  # unix time of the first env step
        self.last = b""  # the last report, encoded: sent again while it waits to be acknowledged

    def collected(self, steps: int, started_at: float) -> None:
        """A rollout of `steps` valid env steps, begun at unix time `started_at`, went out."""
        self.first_step_at = self.first_step_at or started_at
        self.unreported_steps += steps

    def waited_for_credit(self, seconds: float) -> None:
        self.unreported_credit_wait += seconds

    def next(
        self,
        returns: np.ndarray,
        lengths: np.ndarray,
        lineages: np.ndarray,
        acting_s: float,
        env_wait_s: float,
        policy_version: int,
        rejected: int,
    ) -> bytes:
        """The next report, encoded, with the episodes that finished since the last one and the
        collector's times since then; counts them all in the metrics."""
        steps, self.unreported_steps = self.unreported_steps, 0
        m = self.metrics
        m.env_steps.inc(steps)
        m.credit_wait.inc(self.unreported_credit_wait)
        self.unreported_credit_wait = 0.0
        m.acting.inc(acting_s)
        m.env_wait.inc(env_wait_s)
        m.episodes.inc(len(returns))
        m.episode_return.observe_many(returns)
        self.totals = (self.totals[0] + steps, self.totals[1] + len(returns))
        m.returns_given_up.inc(self.unacked.add(returns, lengths, lineages))
        self.last = wire.encode(
            wire.ActorReport(
                name=self.name,
                member=self.member,
                env_steps=steps,
                episode_returns=self.unacked.returns,
                episode_lengths=self.unacked.lengths,
                episode_lineages=self.unacked.lineages,
                policy_version=policy_version,
                rejected=rejected,
                first_step_at=self.first_step_at,
                session=self.session,
                steps_total=self.totals[0],
                episodes_total=self.totals[1],
            )
        )
        return self.last

    def acknowledged(self, ack: wire.ReportAck) -> None:
        """The coordinator counted these totals: keep only the returns it has not counted yet
        (those it has not heard of, and those it heard of but does not count yet)."""
        if (ack.steps_total, ack.episodes_total) >= self.acked:
            self.acked = (ack.steps_total, ack.episodes_total)
            self.uncounted = (ack.steps_uncounted, ack.episodes_uncounted)
        self.unacked.keep_newest(self.totals[1] - ack.episodes_total + ack.episodes_uncounted)
        self.timer.period = ack.report_interval_s or self.run_interval_s

    def last_word(self) -> tuple[float, float]:
        """How long an actor that stops waits for its last report to be counted, and how often it
        sends it again meanwhile: stretched as its reports are, where the coordinator stretched
        them (a large fleet's resends stay within the coordinator's budget too)."""
        period = self.timer.period
        return max(FINAL_ACK_WAIT_S, 2 * period), max(FINAL_RESEND_S, period)

    def due(self) -> bool:
        """Whether the next report is due: every `report_interval_s`, or as much longer as the
        coordinator asks (its reports are budgeted: coordinator/report_budget.py)."""
        return self.timer.due()

    @property
    def settled(self) -> bool:
        """Whether the coordinator heard everything reported and counts all of it (a secure run
        counts claims as the learners confirm the rollouts: the last ones wait for that)."""
        return self.acked == self.totals and self.uncounted == (0, 0)
