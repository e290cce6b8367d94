"""The coordinator's view of the learner world: which process holds each rank, where actors send
it experience, when each rank was last heard from, and which ranks hold the world up
(stragglers.py names them from the heartbeats).

A rank registering from another process (another socket identity) means its world restarted: the
ranks of the new world must all register again before the world counts as complete, and actors
are handed the learners' endpoints only while every rank of the current world is live (registered
or beating within `stragglers.SILENT_S`), never those of a world that is gone or only half back.
"""

from __future__ import annotations

import logging
import math
import time

from rlmq.common.addresses import endpoint_host
from rlmq.coordinator import stragglers
from rlmq.coordinator.records import LearnerRecord

log = logging.getLogger("rlmq.coordinator")


class LearnerWorld:
    def __init__(self, size: int, registered: dict[int, LearnerRecord]) -> None:
        """`registered`: the learners' records in Redis (a restarted coordinator's starting view)."""
        self.size = size
        self.endpoints = {rank: rec.endpoint for rank, rec in registered.items()}
        self.identities = {rank: rec.identity.encode() for rank, rec in registered.items()}
        self.heard: dict[int, float] = {}  # rank → when it last registered or beat (monotonic)
        self.pulses: dict[int, stragglers.Pulse] = {}  # rank → its latest heartbeat
        self.behind: dict[int, str] = {}  # rank → why it holds the world up
        self.checked_at = time.monotonic()  # the last `check`
        self.idle: dict[int, int] = {}  # rank → identities holding credit requests they do not use
        # As `check` last found them; None before the first, which writes both fields whatever it
        # finds: a restarted coordinator clears what the one before it left in the run's status.
        self.hung_ranks: tuple[int, ...] | None = None

    def register(self, rank: int, identity: bytes, endpoint: str) -> None:
        if self.identities.get(rank, identity) != identity:
            log.info("learner rank %d registered from a new process: a new learner world", rank)
            self.identities = {}
        self.identities[rank] = identity
        self.heard[rank] = time.monotonic()
        self.endpoints[rank] = endpoint

    def beat(self, rank: int, iteration: int, waiting_s: float) -> None:
        now = time.monotonic()
        before = self.pulses.get(rank)
        since = before.since if before is not None and now - before.heard <= stragglers.SILENT_S else now
        self.pulses[rank] = stragglers.Pulse(now, iteration, waiting_s, since)
        self.heard[rank] = now

    def live(self) -> int:
        """Ranks of the current world heard from lately."""
        now = time.monotonic()
        return sum(now - self.heard.get(rank, -math.inf) <= stragglers.SILENT_S for rank in self.identities)

    def complete(self) -> bool:
        return self.live() == self.size

    def master_host(self) -> str:
        """The host rank 0 serves experience at, its rendezvous; "" unless rank 0 of the current
        world is live (an earlier world's record, from Redis or a dead process, may be stale)."""
        heard = self.heard.get(0)
        if 0 not in self.identities or heard is None or time.monotonic() - heard > stragglers.SILENT_S:
            return ""
        endpoint = self.endpoints.get(0, "")
        return endpoint_host(endpoint) or ("127.0.0.1" if endpoint.startswith("ipc://") else "")

    def endpoint_list(self) -> tuple[str, ...]:
        return tuple(self.endpoints[rank] for rank in sorted(self.endpoints))

    def idle_requests(self, rank: int, idle: int) -> int | None:
        """A rank counts `idle` identities holding credit requests they do not use: the world's total
        when it changed (None: unchanged), logged when they appear and when they are gone."""
        before = sum(self.idle.values())
        self.idle[rank] = idle
        now = sum(self.idle.values())
        if now and not before:
            log.warning(
                "%d identities hold credit requests at the learners and send no rollout (a stolen actor "
                "key, or actors that cannot collect); the learners serve them last",
                now,
            )
        elif before and not now:
            log.info("no identity holds credit requests it does not use any more")
        return now if now != before else None

    def check(self) -> dict[str, object]:
        """Log the ranks that begin or stop holding the world up; the run's status fields that
        changed since the last check (`learners_behind`, and `learners_hung`: what `rlmq up` acts
        on, restarting the world)."""
        before = self.behind
        behind = self._holding_up()
        for rank, why in behind.items():
            if rank not in before:
                log.warning("learner-%d (rank %d) holds the learner world up: %s", rank, rank, why)
        for rank in before.keys() - behind.keys():
            log.info("learner-%d (rank %d) caught up", rank, rank)
        changed: dict[str, object] = {}
        if behind.keys() != before.keys() or self.hung_ranks is None:
            changed["learners_behind"] = "; ".join(
                f"learner-{r} (rank {r}): {why}" for r, why in sorted(behind.items())
            )
        hung = tuple(stragglers.hung(self.pulses, time.monotonic()))  # the silent ranks the world waits for
        if hung != self.hung_ranks:
            self.hung_ranks = changed["learners_hung"] = hung
        return changed

    def _holding_up(self) -> dict[int, str]:
        """The ranks that hold the world up now, and why."""
        now = time.monotonic()
        away, self.checked_at = now - self.checked_at, now
        if away > stragglers.SILENT_S:  # we were stalled (a Redis outage): their beats wait unread, not missing
            self.pulses = {rank: p._replace(heard=p.heard + away) for rank, p in self.pulses.items()}
        self.behind = stragglers.behind(self.pulses, self.size, now) if self.pulses else {}
        return self.behind
