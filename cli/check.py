"""`rlmq check`: the readiness, liveness and startup probe a container runs beside its service.

    /metrics answers on 127.0.0.1:PORT within the timeout        (always)
    rlmq_loop_heartbeat_timestamp_seconds is at most MAX_AGE old  (with --max-age)
    Redis answers PING                                            (with --redis-url)

Exit 0 and one `ok:` line when all hold; otherwise exit 1 and one `error:` line that names the
fix. Light on purpose (a probe runs every few seconds in every pod): no torch, no zmq, and redis
is imported only when asked for.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from rlmq.common.redis_urls import shown_url

HEARTBEAT = "rlmq_loop_heartbeat_timestamp_seconds"


class CheckFailed(Exception):
    """What is wrong, as the one line the probe prints."""


@dataclass(frozen=True)
class Health:
    heartbeat: float | None  # unix time of the loop's latest iteration; None: not exported; 0: not started


def scrape(port: int, timeout_s: float) -> str:
    """The text of http://127.0.0.1:PORT/metrics, or CheckFailed naming what to fix."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        raise CheckFailed(
            f"{url} answered HTTP {exc.code}: is {port} the rlmq service's --metrics-port (RLMQ_METRICS_PORT)?"
        ) from None
    except (OSError, ValueError) as exc:  # refused, timed out, reset, not HTTP
        reason = getattr(exc, "reason", exc)
        raise CheckFailed(
            f"nothing answers on {url} within {timeout_s:g} s ({reason}): start the "
            f"service with --metrics-port {port} (RLMQ_METRICS_PORT), or wait until "
            "it has started"
        ) from None


def read_health(text: str) -> Health:
    """The loop heartbeat in a /metrics page (the newest, should several series carry it)."""
    try:
        values = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == HEARTBEAT
        ]
    except ValueError as exc:
        raise CheckFailed(
            f"/metrics is not Prometheus text ({exc}): is the port an rlmq service's --metrics-port?"
        ) from None
    return Health(heartbeat=max(values) if values else None)


def judge(health: Health, max_age_s: float, now: float) -> float:
    """The heartbeat's age in seconds, or CheckFailed when it is missing, unset or too old."""
    if health.heartbeat is None:
        raise CheckFailed(
            f"/metrics has no {HEARTBEAT}: the port serves something other than an "
            "rlmq service, or an rlmq older than the gauge (rebuild the image)"
        )
    if health.heartbeat <= 0:
        raise CheckFailed(
            "the service loop has not started yet (still registering with the "
            "coordinator or joining the learner world): wait, or give the startup "
            "probe more time"
        )
    age = now - health.heartbeat
    if age > max_age_s:
        raise CheckFailed(
            f"the service loop last ran {age:.0f} s ago (> --max-age {max_age_s:g}): "
            "it is stuck; restart it (its log says where)"
        )
    return age


def ping_redis(url: str, timeout_s: float) -> None:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise CheckFailed(
            f"Redis at {shown_url(url)} does not answer PING within {timeout_s:g} s ({exc}): "
            "start Redis or fix --redis-url (and --redis-password-file)"
        ) from None


def run_check(port: int, max_age_s: float | None, redis_url: str | None, timeout_s: float) -> str:
    """Every check asked for, in order; the `ok:` line, or CheckFailed at the first that fails."""
    health = read_health(scrape(port, timeout_s))
    said = [f"/metrics on :{port} answers"]
    if max_age_s is not None:
        age = judge(health, max_age_s, time.time())
        said.append(f"loop ran {age:.1f} s ago")
    if redis_url is not None:
        ping_redis(redis_url, timeout_s)
        said.append("Redis answers")
    return "ok: " + "; ".join(said)
