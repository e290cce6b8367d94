"""The end of a run: why it ends, and when it is done.

A run ends on its target (an evaluation of the best member reached it or, on a run that believes
its actors, their reported returns did) or on its env-step budget. From then on its status is final
but for the last counts: `stop` is repeated, since a PUB message can miss a slow joiner, until the
learners' final weights and every rank's final report are in (once the update under way is done);
on a secure run until the actors' last reports have counted what the learners took; on a run that
ended on its budget until its final weights are evaluated. Each wait is bounded, so that a process
that died cannot hold the run open.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import zmq

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.coordinator.judge import Judged
from rlmq.coordinator.store import RunStore

log = logging.getLogger("rlmq.coordinator")
# How long a secure run waits for the actors' last reports to count their last rollouts: each actor
# sends its last report again for up to actors.reports.FINAL_ACK_WAIT_S, or twice its report
# interval where a large fleet's is stretched (the wait is 3 of those then).
ACTORS_LAST_WORD_S = 3.0
# How much longer than the grace period a run that ended on its budget waits for the evaluation of
# its final weights (the learners and actors are done by then): a slow env's 10 episodes, for
# each member.
FINAL_EVALUATION_S = 60.0
# The learners' final weights come after the update under way when `stop` arrives: the wait for them
# is stretched by the longest time in updates one of the ranks' last this many reports that had one
# covered (an off-policy update of a population on a shared core takes tens of seconds: LOG.md §26)...
REPORTS_REMEMBERED = 20
# ...but by no more than this: a rank's update time counts its waits for its peers, so a world that
# stalled (a rank stopped or hung) reports "updates" as long as the stall.
UPDATE_STRETCH_MAX_S = 120.0


class RunEnd:
    """The coordinator's view of its run's end; `evaluates`: the run judges its target by its own
    evaluations (judge.py), not by its actors' reported returns."""

    def __init__(
        self, run_config: RunConfig, evaluates: bool, store: RunStore, broadcast: zmq.Socket[bytes], grace_s: float
    ) -> None:
        self.target, self.budget = run_config.target_return, run_config.total_steps
        self.population = run_config.population
        self.num_learners, self.evaluates = run_config.num_learners, evaluates
        self.store, self.broadcast, self.grace_s = store, broadcast, grace_s
        self.finished_at: float | None = None
        self.passed: Judged | None = None  # the evaluation that reached the target
        self.final_weights = False
        self.final_reports: set[int] = set()  # the learner ranks whose last report is in
        self.recent_update_s: collections.deque[float] = collections.deque(maxlen=REPORTS_REMEMBERED)

    def learner_reported(self, rank: int, update_s: float, final: bool) -> None:
        """A learner's report: its time in updates since its last one, and whether it is its last."""
        if update_s > 0:
            self.recent_update_s.append(update_s)
        if final:
            self.final_reports.add(rank)

    def reported(self, mean_return: float | None, full_record: bool) -> bool:
        """Whether the actors' reports say a member reached the target: the mean of its last
        `return_window` returns (with that many)."""
        return self.target is not None and full_record and mean_return is not None and mean_return >= self.target

    def reason(self, steps: int, mean_return: float | None, full_record: bool) -> str | None:
        """Why the run ends now: "target" (an evaluation reached it; on a run that believes its
        actors' returns, `reported`), "budget" (the env steps), or None."""
        if self.passed is not None or (not self.evaluates and self.reported(mean_return, full_record)):
            return "target"
        return "budget" if steps >= self.budget else None

    def finish(self, reason: str, detail: str, success: bool, steps: int) -> None:
        log.info("run over (%s): %s", reason, detail)
        self.finished_at = time.monotonic()
        status = {"reason": reason, "detail": detail, "success": success, "env_steps_at_end": steps}
        self.store.set_status(state="stopping", ended_at=time.time(), **status)
        self._send_stop(detail)

    def _send_stop(self, detail: str) -> None:
        self.broadcast.send_multipart([wire.DIRECTIVE_TOPIC, wire.encode(wire.Directive("stop", detail))])

    def wind_down(
        self, report_interval_s: float, actors_counted: Callable[[], bool] | None, evaluating: Callable[[], bool]
    ) -> bool:
        """After the end, each tick: `stop` again, and whether the run is done. `actors_counted`
        (a secure run's): whether the actors' reports have counted what the learners took, asked for
        at most ACTORS_LAST_WORD_S or 3 report intervals (an actor that died says no more);
        `evaluating`: whether the final weights' evaluation is still to come, asked once the
        learners are done."""
        assert self.finished_at is not None
        self._send_stop("run over")
        waited = time.monotonic() - self.finished_at
        learners_done = self.final_weights and len(self.final_reports) == self.num_learners
        if learners_done and actors_counted is not None and waited < max(ACTORS_LAST_WORD_S, 3 * report_interval_s):
            learners_done = actors_counted()
        evaluation_pending = learners_done and evaluating()
        stretch = min(max(self.recent_update_s, default=0.0), UPDATE_STRETCH_MAX_S)
        limit = self.grace_s + stretch + (FINAL_EVALUATION_S * self.population if evaluation_pending else 0.0)
        if (learners_done and not evaluation_pending) or waited > limit:
            if not learners_done or evaluation_pending:
                log.warning("done %.1f s after the end without %s", waited, self.missing(evaluation_pending))
            self.store.set_status(state="done", finished_at=time.time())
            return True
        return False

    def missing(self, evaluation_pending: bool) -> str:
        """What a run that gives up waiting is done without."""
        if evaluation_pending:
            return "the evaluation of its final weights"
        absent = sorted(set(range(self.num_learners)) - self.final_reports)
        return (
            ", ".join(
                ([] if self.final_weights else ["the learners' final weights"])
                + ([f"the final reports of learner ranks {absent}"] if absent else [])
            )
            or "every env step the learners took counted by the actors' reports"
        )
