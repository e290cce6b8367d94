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

Nor can a crowd of identities that ask and never send (an actor's key, stolen; issue 41):
- Credits within the budget go only to identities that have delivered a rollout, first come,
  first served, preferring a key other than the last one served (round-robin across keys).
- An identity that has not delivered yet gets a credit only on *probation*, beside the budget, up
  to PROBATION_SLOTS newcomers at once. So the proven fleet never waits for newcomers, and a
  crowd of silent identities gets one credit each, then waits behind everyone; the price is up to
  PROBATION_SLOTS rollouts beyond the budget in flight while newcomers join.
- An identity whose probation credit was taken back unused is *idle*: it is served on probation
  only when no other newcomer holds a probation credit. A name (an actor's, as its key allows) holds one request: a
  new identity of the name takes the old one's place (a restarted actor).
- `idle_requests` counts the identities that hold requests they do not use (idle ones that ask
  again): the learner's metric and reports, and `rlmq status`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

TURNAROUND_FACTOR = 4.0  # grant timeout = this × the slowest recent turnaround
TURNAROUNDS_KEPT = 32
LATE_GROWTH = 2.0  # a late rollout raises the grant timeout by at most this factor
MAX_WAITING = 4096  # requests held at once; a flood of Hellos pushes out the oldest
MAX_REVOKED = 4096  # credits taken back whose rollout may still come
MAX_KNOWN = 4096  # identities remembered as proven, or idle
# Newcomers on probation at once, beside the budget: a fleet joins in one round, and a crowd of
# identities that never deliver costs one credit each before it waits behind everyone.
PROBATION_SLOTS = 64
ROUND_ROBIN_LOOKAHEAD = 8  # requests looked past for one of another key than the last served


@dataclass(frozen=True)
class CreditTimeouts:
    request_ttl_s: float = 1.0  # a request for credit not renewed this long is forgotten
    min_s: float = 0.5  # the grant timeout never falls below this ...
    max_s: float = 10.0  # ... nor rises above this (the timeout before any rollout came back)


class CreditLedger:
    def __init__(self, budget: int, timeouts: CreditTimeouts, most: int = 0) -> None:
        self.budget, self.most, self.timeouts = budget, max(most, budget), timeouts
        # actor → when last heard (a request or a rollout), oldest first: the proven fleet the budget follows
        self.heard: OrderedDict[bytes, float] = OrderedDict()
        # Requests, in the order of first request (a renewal keeps the place): actor → (renewed at,
        # key). Those of identities that delivered before, of newcomers, and of idle newcomers.
        self.proven_waiting: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self.new_waiting: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self.idle_waiting: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self.granted: dict[bytes, float] = {}  # actor → when its one credit was granted
        self.probation: set[bytes] = set()  # newcomers holding a credit beside the budget
        # actor → (when the lost credit was granted, the grant timeout it missed)
        self.revoked: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self.turnarounds: deque[float] = deque(maxlen=TURNAROUNDS_KEPT)
        self.proven: OrderedDict[bytes, None] = OrderedDict()  # delivered a rollout
        self.idle: OrderedDict[bytes, None] = OrderedDict()  # a probation credit taken back unused
        self.by_name: OrderedDict[str, bytes] = OrderedDict()  # a name's one waiting identity
        self.last_key = ""
        self.keys: dict[bytes, str] = {}  # the key each credit out went to

    @property
    def in_flight(self) -> int:
        return len(self.granted)

    @property
    def waiting(self) -> list[bytes]:
        """Every identity with a request: the proven, the newcomers, the idle, each in order of request."""
        return [*self.proven_waiting, *self.new_waiting, *self.idle_waiting]

    def holds(self, actor: bytes) -> bool:
        return actor in self.granted

    def budget_at(self, seen: float) -> int:
        """The credits (out and spent on queued rollouts) allowed now: `budget`, or one per proven
        actor holding one or heard from within the request TTL, up to `most`."""
        if self.most == self.budget:
            return self.budget
        while self.heard and seen - next(iter(self.heard.values())) > self.timeouts.request_ttl_s:
            self.heard.popitem(last=False)
        fleet = self.in_budget + sum(actor not in self.granted for actor in self.heard)
        return min(max(self.budget, fleet), self.most)

    @property
    def in_budget(self) -> int:
        """Credits out within the budget (probation credits are beside it)."""
        return len(self.granted) - len(self.probation)

    def hear(self, actor: bytes, now: float) -> None:
        if self.most > self.budget and actor in self.proven:
            self.heard[actor] = now
            self.heard.move_to_end(actor)
            if len(self.heard) > MAX_WAITING:
                self.heard.popitem(last=False)

    def grant_timeout_s(self) -> float:
        if not self.turnarounds:
            return self.timeouts.max_s
        return min(max(TURNAROUND_FACTOR * max(self.turnarounds), self.timeouts.min_s), self.timeouts.max_s)

    def hello(self, actor: bytes, now: float, name: str = "", key: str = "") -> None:
        """The actor asks for credit, or renews its request. If our ledger says it holds one, that
        credit may still be on its way: leave it to arrive or to time out. `name`: whom it speaks
        as (a name holds one request); `key`: the key it came with (served round-robin)."""
        self.hear(actor, now)
        if actor in self.granted:
            return
        if name:
            before = self.by_name.get(name)
            if before is not None and before != actor:  # the name's new identity (a restarted actor)
                for queue in (self.proven_waiting, self.new_waiting, self.idle_waiting):
                    queue.pop(before, None)
            self.by_name[name] = actor
            self.by_name.move_to_end(name)
            if len(self.by_name) > MAX_WAITING:
                self.by_name.popitem(last=False)
        queue = (
            self.proven_waiting
            if actor in self.proven
            else self.idle_waiting
            if actor in self.idle
            else self.new_waiting
        )
        queue[actor] = (now, key)  # an existing key keeps its place
        if len(queue) > MAX_WAITING:
            queue.popitem(last=False)

    def delivered(self, actor: bytes, now: float, queued: int) -> bool:
        """A rollout arrived from `actor`: whether it is within the budget (`queued`: rollouts
        received before it and not yet trained). Its credit is spent either way, and an actor that
        held one asks for the next."""
        since = self.granted.pop(actor, None)
        self.probation.discard(actor)
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
        remember(self.proven, actor)
        self.idle.pop(actor, None)
        self.new_waiting.pop(actor, None)
        self.idle_waiting.pop(actor, None)
        self.proven_waiting[actor] = (now, self.keys.pop(actor, ""))
        self.hear(actor, now)
        return not late or self.in_budget + queued < self.budget_at(now)

    def grant(self, now: float, queued: int, read_at: float | None = None) -> list[bytes]:
        """Actors to send one credit each, now. `queued`: rollouts received but not yet trained.
        Credits and requests are judged by `read_at` (default: now), when the actors' messages
        were last read: a rollout or a renewal still unread is not missing."""
        seen = now if read_at is None else read_at
        timeout = self.grant_timeout_s()
        # Until a rollout came back, a newcomer on probation gets the shortest timeout, not the longest:
        # a crowd of silent identities ahead of the fleet would cost each the full max_s.
        probation_timeout = timeout if self.turnarounds else self.timeouts.min_s
        for actor, since in list(self.granted.items()):
            if seen - since > (probation_timeout if actor in self.probation else timeout):
                # it died, or the credit was lost: it asks again if it lives
                del self.granted[actor]
                self.keys.pop(actor, None)
                self.revoked[actor] = (since, timeout)
                if len(self.revoked) > MAX_REVOKED:
                    self.revoked.popitem(last=False)
                if actor in self.probation:
                    self.probation.discard(actor)
                    remember(self.idle, actor)
        granted, budget = [], self.budget_at(seen)
        while self.in_budget + queued < budget:
            proven = self.next_request(self.proven_waiting, seen)
            if proven is None:
                break
            self.granted[proven] = now
            granted.append(proven)
        # Newcomers never served, first come first served, up to PROBATION_SLOTS at once (each costs
        # one credit ever, so a crowd of them is soon through); never more beyond the budget than
        # the slots, their rollouts counted once queued. Idle ones only while no other is on probation.
        while self.in_budget + queued + len(self.probation) < budget + PROBATION_SLOTS:
            newcomer = self.next_request(self.new_waiting, seen)
            if newcomer is None and not self.probation:
                newcomer = self.next_request(self.idle_waiting, seen)
            if newcomer is None:
                break
            self.granted[newcomer] = now
            self.probation.add(newcomer)
            granted.append(newcomer)
        return granted

    def next_request(self, queue: OrderedDict[bytes, tuple[float, str]], seen: float) -> bytes | None:
        """The oldest living request in `queue`, of a key other than the last one served if one is
        among the next few, taken out of the queue; requests not renewed within the TTL are dropped
        on the way."""
        first: bytes | None = None
        chosen: bytes | None = None
        looked = 0
        for actor, (renewed, key) in list(queue.items()):
            if seen - renewed > self.timeouts.request_ttl_s:
                del queue[actor]  # not renewed: gone
                continue
            if key != self.last_key:
                chosen = actor
                break
            first = first or actor
            looked += 1
            if looked > ROUND_ROBIN_LOOKAHEAD:
                break
        chosen = chosen or first
        if chosen is not None:
            self.last_key = self.keys[chosen] = queue.pop(chosen)[1]
        return chosen

    def idle_requests(self) -> int:
        """Identities holding requests they do not use: their probation credit was taken back unused,
        and they ask again. (A newcomer that merely waits is not counted: it has had no credit.)"""
        return len(self.idle_waiting)


def remember(known: OrderedDict[bytes, None], actor: bytes) -> None:
    known[actor] = None
    known.move_to_end(actor)
    if len(known) > MAX_KNOWN:
        known.popitem(last=False)
