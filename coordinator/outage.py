"""Redis outages as a client rides them out: which errors are an outage, and a retry with a budget
in seconds (`OutageRetry`) that every `RunStore.connect` client shares between its commands."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rlmq.common.redis_urls import shown_url

# What an outage looks like to a client: refused or dropped connections, a server still loading its
# AOF (BusyLoadingError is a ConnectionError), a server that does not answer in time.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
# A wrong password or a missing permission is not an outage: waiting would not mend it.
NOT_OUTAGES = (redis.AuthenticationError, redis.exceptions.AuthorizationError)
T = TypeVar("T")
log = logging.getLogger("rlmq.store")


class OutageRetry(Retry):
    """redis-py's Retry with a budget in seconds, not a count: every command, pipeline and
    (re)connect of one client retries outage errors with backoff until `budget_s` after the outage
    began, then raises the last error.

    The clock belongs to the outage, not to the call: it starts at the first failure after a
    success and stops at the next success. So the nested retries redis-py makes (a command's, and
    inside it the reconnect's) share one deadline, and once a budget is spent every later call
    fails after a single try until Redis answers again, instead of waiting a whole budget each.
    A pipeline is retried whole from its command stack: nothing it had to write is dropped, unless
    `give_up()` turns true (a service asked to stop), which ends the wait early.
    """

    def __init__(
        self,
        url: str,
        budget_s: float,
        report: Callable[[str], object] | None = log.warning,
        give_up: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), retries=-1)  # -1: the clock decides
        self.url, self.budget_s, self.report, self.give_up = shown_url(url), budget_s, report, give_up
        self.outage_since: float | None = None  # monotonic time of the outage's first failure
        self._depth = 0  # call_with_retry nesting: only the outermost call ends an outage

    def __deepcopy__(self, memo: dict[int, Any]) -> OutageRetry:
        return self  # redis-py copies its Retry into every connection: they must share one clock

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        failures = 0
        self._depth += 1
        try:
            while True:
                try:
                    result = do()
                except NOT_OUTAGES:
                    raise
                except self._supported_errors as error:
                    if is_retryable is not None and not is_retryable(error):
                        raise
                    failures += 1
                    if with_failure_count:
                        fail(error, failures)
                    else:
                        fail(error)
                    wait = self._wait(failures)
                    if wait is None:
                        raise
                    time.sleep(wait)
                else:
                    if self.outage_since is not None and self._depth == 1:
                        self._report(
                            f"Redis at {self.url} reachable again after {time.monotonic() - self.outage_since:.1f} s"
                        )
                        self.outage_since = None
                    return result
        finally:
            self._depth -= 1

    def _wait(self, failures: int) -> float | None:
        """Seconds to sleep before the next try, or None once the outage has spent the budget."""
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
            self._report(f"Redis unreachable at {self.url}; retrying for up to {self.budget_s:.3g} s")
        left = self.outage_since + self.budget_s - now
        if left <= 0 or (self.give_up is not None and self.give_up()):
            return None
        return min(self._backoff.compute(failures), left)

    def _report(self, line: str) -> None:
        if self.report is not None and self.budget_s > 0:  # a single try has no outage to speak of
            self.report(line)
