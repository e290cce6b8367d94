"""Named points at which a test makes a service die, to show what survives a crash there.

Armed only by a service's hidden `--failpoint` option (env RLMQ_FAILPOINT), which tests alone set;
unarmed, `reach` is one string comparison. The exit is `os._exit`: no cleanup, as a SIGKILL.
"""

from __future__ import annotations

import logging
import os

EXIT_FAILPOINT = 86  # a failpoint's exit status, apart from every status a service exits with

REPORT_BEFORE_ACK = "report-before-ack"  # coordinator: a report counted, not yet acknowledged
PBT_AFTER_APPEND = "pbt-after-append"  # coordinator: a PBT decision logged, not yet applied
# A learner rank exits at the start of the update after its first checkpoint, while the other ranks
# wait for it in that update's all-reduce (DDP) or the next iteration's gather (replicas).
LEARNER_IN_UPDATE = "exit-in-update-after-checkpoint"

log = logging.getLogger("rlmq.failpoint")


def reach(armed: str, point: str, where: str) -> None:
    """Die at once if `point` is the `armed` failpoint; `where` says what has and has not happened."""
    if armed and armed == point:
        log.error("failpoint %s: exiting %s", point, where)
        os._exit(EXIT_FAILPOINT)
