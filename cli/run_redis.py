"""`rlmq up` and its run's Redis: what it last read of the run, riding out outages, restarting
a private server that died, and writing the run's results whatever became of Redis.

The coordinator does the waiting for Redis (`--redis-outage-s`). The supervisor's own reads give up
within WATCH_REDIS_S, so that children are still watched and Ctrl-C still answered while Redis is
down; what it last read stands in for Redis meanwhile, and at the end if Redis never comes back.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from rlmq.cli import rundir
from rlmq.cli.redis_server import RedisServer
from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.redis_urls import shown_url, without_password
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.records import MemberRecord, ProgressSample, RunStatus
from rlmq.coordinator.store import OUTAGE_ERRORS, PROGRESS_SAMPLES, RunStore

MAX_REDIS_RESTARTS = 5  # the private Redis server's: one that keeps dying has a cause to look at
# The watch loop's Redis reads give up this soon (their budget and their socket timeouts).
WATCH_REDIS_S = 1.0


@dataclass
class LastSeen:
    """What `rlmq up` last read of its run in Redis: the results it writes if Redis is gone at the end."""

    status: RunStatus = field(default_factory=RunStatus)
    progress: list[ProgressSample] = field(default_factory=list)  # every sample so far, oldest first
    weights: dict[int, wire.Weights] = field(default_factory=dict)  # member → its latest weights read
    records: dict[int, MemberRecord] = field(default_factory=dict)
    looks: int = 0

    TAIL = 64  # samples read per look: the coordinator writes two a second, `rlmq up` looks every 2 s
    WEIGHTS_EVERY = 5  # looks: weights are larger, and a checkpoint ten seconds old still serves

    def read(self, store: RunStore, population: int) -> None:
        """Refresh from Redis (its errors propagate): the status, and the progress samples newer
        than the last one read. By time, not index: Redis trims the list at PROGRESS_SAMPLES, and a
        private Redis killed outright may come back without its last writes. Every WEIGHTS_EVERY
        looks, and at every look until each member's first trained weights (past version 0, the
        initial ones) are in hand, the members' weights and records too: a run whose Redis goes
        soon after its first update still leaves a trained checkpoint."""
        untrained = any(self.weights.get(m) is None or self.weights[m].version == 0 for m in range(population))
        if self.looks % self.WEIGHTS_EVERY == 0 or untrained:
            for member in range(population):
                try:
                    weights = store.weights(member)
                except wire.WireError:  # Redis is not trusted more than the wire: keep what we had
                    continue
                if weights is not None:
                    self.weights[member] = weights
            self.records = store.members()
        self.looks += 1
        status = store.status()
        last = self.progress[-1].time if self.progress else None
        new = store.progress() if last is None else store.progress(start=-self.TAIL)
        if last is not None:
            if new and new[0].time > last:  # more came than one tail holds
                new = store.progress()
            new = [sample for sample in new if sample.time > last]
        self.status = status
        self.progress = (self.progress + new)[-PROGRESS_SAMPLES:]


class RunRedis:
    """The supervisor's side of its run's Redis."""

    def __init__(
        self, url: str, server: RedisServer | None, outage_s: float, run: str, run_dir: Path, run_config: RunConfig
    ) -> None:
        self.url, self.server, self.outage_s = url, server, outage_s
        self.run, self.run_dir, self.run_config = run, run_dir, run_config
        self.seen = LastSeen()
        self.down_since: float | None = None  # monotonic; None while Redis answers
        self.restarts = 0

    def watching_store(self) -> RunStore:
        """A store for the watch loop: it gives up within WATCH_REDIS_S, and says nothing itself."""
        return RunStore.connect(self.url, self.run, outage_s=WATCH_REDIS_S, timeout_s=WATCH_REDIS_S, report=None)

    def look(self, store: RunStore) -> bool:
        """Refresh `seen` from Redis; False if it does not answer (said once per outage, as is its end)."""
        try:
            self.seen.read(store, self.run_config.population)
        except OUTAGE_ERRORS:
            if self.down_since is None:
                self.down_since = time.monotonic()
                print(
                    f"Redis at {shown_url(self.url)} unreachable; still supervising (the coordinator "
                    f"waits up to {self.outage_s:g} s for it)",
                    flush=True,
                )
            return False
        self.answered()
        return True

    def answered(self) -> None:
        """Redis answered: say that an outage ended, once."""
        if self.down_since is not None:
            print(
                f"Redis at {shown_url(self.url)} reachable again after {time.monotonic() - self.down_since:.1f} s",
                flush=True,
            )
            self.down_since = None

    def keep_up(self) -> str | None:
        """Restart the private Redis server if it died, on its port and data directory (its AOF
        brings the run's state back); 'failed: why' once restarts did not keep it up."""
        server = self.server
        if server is None or server.process.poll() is None:
            return None
        if self.restarts >= MAX_REDIS_RESTARTS:
            return f"failed: the private Redis server died {self.restarts + 1} times; see {server.data_dir}/redis.log"
        self.restarts += 1
        print(
            f"the private Redis server exited with {server.process.returncode}; restarting it ({self.restarts})",
            flush=True,
        )
        try:
            server.restart()
        except RuntimeError as exc:  # still dead: the next loop counts it again
            print(f"restarting Redis failed: {exc}", flush=True)
        return None

    def save_results(self, spec: EnvSpec, launched: float, outcome: str) -> RunStatus:
        """Write the run's results whatever became of Redis; return its last status.

        From Redis if it answers within what is left of the outage budget (counted from when the
        watch loop found it down; after an interrupt no more than the watch loop's, since the user
        asked to stop); else metrics.csv, the learning curve and summary.json from what was last
        read (the checkpoint from the weights last read)."""
        self.keep_up()
        server_dead = self.server is not None and self.server.process.poll() is not None
        down_for = 0.0 if self.down_since is None else time.monotonic() - self.down_since
        budget = 0.0 if server_dead else max(self.outage_s - down_for, 0.0)
        if outcome == "interrupted":
            budget = min(budget, WATCH_REDIS_S)
        say = functools.partial(print, flush=True)
        store = RunStore.connect(self.url, self.run, outage_s=budget, report=say)
        try:
            self.seen.read(store, self.run_config.population)
            self.answered()  # the run may end before the watch loop's next look
            rundir.write_results(self.run_dir, store, spec, self.run_config, launched, outcome)
        except OUTAGE_ERRORS as exc:
            print(
                f"error: Redis at {shown_url(self.url)} unreachable ({exc}): checkpoint.pt, metrics.csv "
                "and summary.json hold what rlmq up last read of the run",
                file=sys.stderr,
                flush=True,
            )
            rundir.write_last_seen(
                self.run_dir,
                self.run,
                self.seen.status,
                self.seen.progress,
                self.run_config,
                launched,
                outcome,
                spec,
                self.seen.weights,
                self.seen.records,
            )
        return self.seen.status


def unreachable(url: str, run: str) -> str | None:
    """Why `rlmq up --redis-url URL` cannot use that Redis, as a line that says what to do; None if it can."""
    fix = "start it or drop --redis-url to use a private one"
    try:
        RunStore.connect(url, run, outage_s=WATCH_REDIS_S, timeout_s=WATCH_REDIS_S, report=None).ping()
    except ValueError as exc:  # not a Redis URL at all
        return f"error: --redis-url {url}: {exc}"
    except OUTAGE_ERRORS as exc:
        return f"error: cannot reach Redis at {shown_url(url)} ({exc}): {fix}"
    except redis.RedisError as exc:  # reached, but refused: a password, a permission
        return f"error: Redis at {shown_url(url)} refused rlmq ({exc}): fix the URL's credentials or {fix}"
    return None


def reopen(url: str, run: str, run_config: RunConfig) -> bool:
    """`rlmq up --resume`: the run in Redis goes on under `run_config` (its new budget and target);
    False if Redis does not hold it."""
    return RunStore.connect(url, run, outage_s=WATCH_REDIS_S, report=None).reopen(run_config)


def redis_address(url: str, server: RedisServer | None, run_dir: Path) -> tuple[str, str]:
    """(`url` without its password, the file that holds it: "" for a Redis without one). The
    private server keeps its own; a password in --redis-url goes to RUN_DIR/redis-password, 0600."""
    address, password = without_password(url)
    if not password:
        return address, ""
    if server is not None:
        return address, server.password_file
    path = run_dir / "redis-password"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(password + "\n")
    return address, str(path)
