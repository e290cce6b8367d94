"""The coordinator as a process: its store connected, its loop run, and how it ends.

Exit codes say what a supervisor may do: 0 the run is over; 1 Redis gone past `redis_outage_s`
(start it again once Redis is back: it resumes from Redis); 2 bad usage; EXIT_DISK Redis cannot
write to its disk (starting it again would meet the same disk: free space, then resume).
"""

from __future__ import annotations

import logging

import redis

from rlmq.common import envs
from rlmq.common.config import CoordinatorConfig
from rlmq.common.redis_urls import shown_url
from rlmq.common.service import EXIT_DISK, EXIT_FAILED, EXIT_USAGE, StopFlag
from rlmq.coordinator.coordinator import Coordinator
from rlmq.coordinator.store import OUTAGE_ERRORS, RunStore

log = logging.getLogger("rlmq.coordinator")


def main(cfg: CoordinatorConfig, stop: StopFlag) -> int:
    # Every access retries through an outage of up to `redis_outage_s` (store.OutageRetry); past
    # that the run cannot go on without its state, and the error ends the process here. A stop
    # request ends the wait too: a supervisor's SIGTERM must not wait out the budget.
    store = RunStore.connect(cfg.redis_url, cfg.run, outage_s=cfg.redis_outage_s, report=log.warning, give_up=stop)
    try:
        coordinator = Coordinator(cfg, store, stop)
    except envs.EnvError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    except OUTAGE_ERRORS as exc:
        return redis_gone(cfg, stop, exc)
    try:
        return coordinator.run()
    except OUTAGE_ERRORS as exc:
        return redis_gone(cfg, stop, exc)
    except redis.ResponseError as exc:
        if not refuses_writes(exc):
            raise
        log.error("Redis cannot write the run's data to its disk (%s)", exc)
        return EXIT_DISK
    finally:
        coordinator.close()


def refuses_writes(exc: redis.ResponseError) -> bool:
    """Whether Redis refused a write because it cannot persist it (its disk full or read-only)."""
    text = str(exc)
    return text.startswith("MISCONF") or "No space left" in text or "Errors writing" in text


def redis_gone(cfg: CoordinatorConfig, stop: StopFlag, exc: Exception) -> int:
    url = shown_url(cfg.redis_url)
    if stop.is_set():
        log.error("stopped while Redis at %s was unreachable (%s): the write under way is lost", url, exc)
    else:
        log.error(
            "giving up: Redis at %s unreachable for %g s (%s); start the coordinator again with the "
            "same --run once Redis is back to resume the run",
            url,
            cfg.redis_outage_s,
            exc,
        )
    return EXIT_FAILED
