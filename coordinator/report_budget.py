"""How often the actors report, so that a fleet's reports take at most a share of the coordinator.

Each actor reports its totals every `report_interval_s`, and each report costs the coordinator a
decode, a counting script in Redis and an acknowledgement, one after another on its one thread. A
fleet large enough that its reports would take more than REPORT_SHARE of the coordinator's time is
asked, in every acknowledgement (`ReportAck.report_interval_s`), to report that much less often.
What a report takes is measured here, not assumed: on a loaded host it takes longer, and the fleet
is asked to report less often still. The stretch ends where a live actor would start to look gone.
docs/architecture.md, "Capacity", says what it buys.
"""

from __future__ import annotations

from rlmq.common import wire

REPORT_SHARE = 0.25  # of the coordinator's time, at most, for its actors' reports
COST_WEIGHT = 0.01  # of each report in the running mean of what one takes


def report_interval(run_interval_s: float, actors: int, report_cost_s: float, actor_timeout_s: float) -> float:
    """How often each of `actors` live actors is to report, each report taking `report_cost_s`:
    the run's interval while their reports take at most REPORT_SHARE of the coordinator's time,
    longer beyond, but never so long that a live actor would look gone (a third of
    `actor_timeout_s`)."""
    longest = min(max(run_interval_s, actor_timeout_s / 3), wire.MAX_REPORT_INTERVAL_S)
    return min(max(run_interval_s, actors * report_cost_s / REPORT_SHARE), longest)


class ReportBudget:
    def __init__(self, run_interval_s: float, actor_timeout_s: float) -> None:
        self.run_interval_s, self.actor_timeout_s = run_interval_s, actor_timeout_s
        self.cost_s = 0.0  # running mean of the wall time one report takes
        self.asked_s = 0.0  # what acknowledgements ask for: 0 while the run's interval will do

    def took(self, seconds: float) -> None:
        """One report took this long, decoded, counted and acknowledged."""
        self.cost_s += (COST_WEIGHT if self.cost_s else 1.0) * (seconds - self.cost_s)

    def follow(self, actors: int) -> None:
        """The fleet now has `actors` live actors."""
        interval = report_interval(self.run_interval_s, actors, self.cost_s, self.actor_timeout_s)
        self.asked_s = interval if interval > self.run_interval_s else 0.0
