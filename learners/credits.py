"""Credit-based flow control: how a learner rank keeps the data it has not trained on bounded.

An actor may send a rollout to a learner only when it holds a credit from it. The learner grants
credits, oldest request first, while (credits out) + (rollouts queued) < budget. So however
many actors there are, at most `budget` rollouts exist for this learner at once, and the policy lag
stays near budget / rollouts-per-update instead of growing with the actor count and the socket
buffers. With learner batching (`most` > budget) the budget follows the fleet: one credit per
actor that holds one or was heard from within the request TTL, at least `budget` and at most
`most`, so that N actors feed a batch N rollouts wide, one update old at most. The learner drops
a rollout from an actor that holds no credit, so the bound is enforced, not hoped for. Pure
bookkeeping.

No peer can stall it, alive or dead:
- A request for credit is a lease. An actor that waits repeats its request (a `Hello`) every
  `wire.CREDIT_REQUEST_RENEW_S`; a request not renewed within `request_ttl_s` is forgotten. So a
  dead actor, a restarted actor's old identity or a stray `Hello` that is never repeated leaves
  the queue within the TTL, instead of being handed a credit it will never use.
- A credit not used within the grant timeout is taken back. The timeout follows the actors: a few
  times the slowest recent turnaround (grant → rollout), kept within [min_s, max_s]; max_s until a
  rollout has come back. A rollout that arrives after its credit was taken back still teaches the
  ledger how slow its actors are, but at most twice the timeout it missed: slow actors raise the
  timeout by doubling, while one rollout held up by a partition does not set it to its ceiling for
  the next TURNAROUNDS_KEPT rollouts. It is kept when the budget has room for it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

TURNAROUND_FACTOR = 4.0  # grant timeout = this × the slowest recent turnaround
TURNAROUNDS_KEPT = 32
LATE_GROWTH = 2.0  # a late rollout raises the grant timeout by at most this factor
MAX_WAITING = 4096  # requests held at once; a flood of Hellos pushes out the oldest
MAX_REVOKED = 4096  # credits taken back whose rollout may still come


@dataclass(frozen=True)
class CreditTimeouts:
    request_ttl_s: float = 1.0  # a request for credit not renewed this long is forgotten
    min_s: float = 0.5  # the grant timeout never falls below this ...
    max_s: float = 10.0  # ... nor rises above this (the timeout before any rollout came back)


class CreditLedger:
    def __init__(self, budget: int, timeouts: CreditTimeouts, most: int = 0) -> None:
        self.budget, self.most, self.timeouts = budget, max(most, budget), timeouts
        # actor → when last heard (a request or a rollout), oldest first: the fleet the budget follows
        self.heard: OrderedDict[bytes, float] = OrderedDict()
        # actor → its latest request; in the order of first request (a renewal keeps the place)
        self.waiting: OrderedDict[bytes, float] = OrderedDict()
        self.granted: dict[bytes, float] = {}  # actor → when its one credit was granted
        # actor → (when the lost credit was granted, the grant timeout it missed)
        self.revoked: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self.turnarounds: deque[float] = deque(maxlen=TURNAROUNDS_KEPT)

    @property
    def in_flight(self) -> int:
        return len(self.granted)

    def holds(self, actor: bytes) -> bool:
        return actor in self.granted

    def budget_at(self, seen: float) -> int:
        """The credits (out and spent on queued rollouts) allowed now: `budget`, or one per actor
        holding one or heard from within the request TTL, up to `most`."""
        if self.most == self.budget:
            return self.budget
        while self.heard and seen - next(iter(self.heard.values())) > self.timeouts.request_ttl_s:
            self.heard.popitem(last=False)
        fleet = len(self.granted) + sum(actor not in self.granted for actor in self.heard)
        return min(max(self.budget, fleet), self.most)

    def hear(self, actor: bytes, now: float) -> None:
        if self.most > self.budget:
            self.heard[actor] = now
            self.heard.move_to_end(actor)
            if len(self.heard) > MAX_WAITING:
                self.heard.popitem(last=False)

    def grant_timeout_s(self) -> float:
        if not self.turnarounds:
            return self.timeouts.max_s
        return min(max(TURNAROUND_FACTOR * max(self.turnarounds), self.timeouts.min_s), self.timeouts.max_s)

    def hello(self, actor: bytes, now: float) -> None:
        """The actor asks for credit, or renews its request. If our ledger says it holds one, that
        credit may still be on its way: leave it to arrive or to time out."""
        self.hear(actor, now)
        if actor in self.granted:
            return
        self.waiting[actor] = now  # an existing key keeps its place
        if len(self.waiting) > MAX_WAITING:
            self.waiting.popitem(last=False)

    def delivered(self, actor: bytes, now: float, queued: int) -> bool:
        """A rollout arrived from `actor`: whether it is within the budget (`queued`: rollouts
        received before it and not yet trained). Its credit is spent either way, and an actor that
        held one asks for the next."""
        since = self.granted.pop(actor, None)
        turnaround = 0.0 if since is None else now - since
        late = since is None
        if late:
            revoked = self.revoked.pop(actor, None)
            if revoked is None:
                return False  # never granted one: no place in the queue either
            # against the timeout it missed, not today's: actors cut off together all come late,
            # and each capped against the last one's raise would take it to the ceiling after all
            turnaround = min(now - revoked[0], LATE_GROWTH * revoked[1] / TURNAROUND_FACTOR)
        self.turnarounds.append(turnaround)
        self.waiting[actor] = now
        self.hear(actor, now)
        return not late or self.in_flight + queued < self.budget_at(now)

    def grant(self, now: float, queued: int, read_at: float | None = None) -> list[bytes]:
        """Actors to send one credit each, now. `queued`: rollouts received but not yet trained.
        Credits and requests are judged by `read_at` (default: now), when the actors' messages
        were last read: a rollout or a renewal still unread is not missing."""
        seen = now if read_at is None else read_at
        timeout = self.grant_timeout_s()
        for actor, since in list(self.granted.items()):
            if seen - since > timeout:  # it died, or the credit was lost: it asks again if it lives
                del self.granted[actor]
                self.revoked[actor] = (since, timeout)
                if len(self.revoked) > MAX_REVOKED:
                    self.revoked.popitem(last=False)
        granted, budget = [], self.budget_at(seen)
        while self.waiting and self.in_flight + queued < budget:
            actor, asked = self.waiting.popitem(last=False)
            if seen - asked > self.timeouts.request_ttl_s:
                continue  # not renewed: gone
            self.granted[actor] = now
            granted.append(actor)
        return granted
