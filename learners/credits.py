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
- An identity that has not delivered yet gets a credit only on *probation*: one at a time, beside
  the budget, newest and oldest request in turn. So newcomers join one after another and the
  proven fleet never waits for them; the price is one rollout beyond the budget in flight while
  newcomers join.
- An identity whose probation credit was taken back unused is *idle*: it is served on probation
  only when no other newcomer waits. A name (an actor's, as its key allows) holds one request: a
  new identity of the name takes the old one's place (a restarted actor).
- `idle_requests` counts the identities that hold requests they do not use (idle, or waiting
  IDLE_AFTER_S without ever delivering): the learner's metric and reports, and `rlmq status`.
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
ROUND_ROBIN_LOOKAHEAD = 8  # requests looked past for one of another key than the last served
IDLE_AFTER_S = 10.0  # a newcomer waiting this long without a rollout counts as holding a request it does not use


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
        # key, first asked at). Those of identities that delivered before, and the newcomers'.
        self.proven_waiting: OrderedDict[bytes, tuple[float, str, float]] = OrderedDict()
        self.new_waiting: OrderedDict[bytes, tuple[float, str, float]] = OrderedDict()
        self.granted: dict[bytes, float] = {}  # actor → when its one credit was granted
        self.probation: bytes | None = None  # the newcomer holding the credit beside the budget
        # actor → (when the lost credit was granted, the grant timeout it missed)
        self.revoked: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self.turnarounds: deque[float] = deque(maxlen=TURNAROUNDS_KEPT)
        self.proven: OrderedDict[bytes, None] = OrderedDict()  # delivered a rollout
        self.idle: OrderedDict[bytes, None] = OrderedDict()  # a probation credit taken back unused
        self.by_name: OrderedDict[str, bytes] = OrderedDict()  # a name's one waiting identity
        self.last_key = ""
        self.newest_first = True  # whether the last probation credit went to the newest request (they alternate)
        self.keys: dict[bytes, str] = {}  # the key each credit out went to

    @property
    def in_flight(self) -> int:
        return len(self.granted)

    @property
    def waiting(self) -> list[bytes]:
        """Every identity with a request: the proven first, each in order of request."""
        return [*self.proven_waiting, *self.new_waiting]

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
        """Credits out within the budget (the probation credit is beside it)."""
        return len(self.granted) - (self.probation is not None)

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
                self.proven_waiting.pop(before, None)
                self.new_waiting.pop(before, None)
            self.by_name[name] = actor
            self.by_name.move_to_end(name)
            if len(self.by_name) > MAX_WAITING:
                self.by_name.popitem(last=False)
        queue = self.proven_waiting if actor in self.proven else self.new_waiting
        first = queue[actor][2] if actor in queue else now
        queue[actor] = (now, key, first)  # an existing key keeps its place
        if len(queue) > MAX_WAITING:
            queue.popitem(last=False)

    def delivered(self, actor: bytes, now: float, queued: int) -> bool:
        """A rollout arrived from `actor`: whether it is within the budget (`queued`: rollouts
        received before it and not yet trained). Its credit is spent either way, and an actor that
        held one asks for the next."""
        since = self.granted.pop(actor, None)
        if actor == self.probation:
            self.probation = None
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
        self.proven_waiting[actor] = (now, self.keys.pop(actor, ""), now)
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
            if seen - since > (probation_timeout if actor == self.probation else timeout):
                # it died, or the credit was lost: it asks again if it lives
                del self.granted[actor]
                self.keys.pop(actor, None)
                self.revoked[actor] = (since, timeout)
                if len(self.revoked) > MAX_REVOKED:
                    self.revoked.popitem(last=False)
                if actor == self.probation:
                    self.probation = None
                    remember(self.idle, actor)
        granted, budget = [], self.budget_at(seen)
        while self.in_budget + queued < budget:
            proven = self.next_request(self.proven_waiting, seen)
            if proven is None:
                break
            self.granted[proven] = now
            granted.append(proven)
        if self.probation is None and self.in_budget + queued <= budget:  # never more than one beyond it
            # Newest first and oldest first in turn: a crowd that asked before the fleet does not hold
            # the fleet's newcomers back, and one that keeps sending new identities cannot either.
            self.newest_first = not self.newest_first
            newcomer = self.next_request(self.new_waiting, seen, skip=self.idle, newest=self.newest_first) or \
                self.next_request(self.new_waiting, seen, newest=self.newest_first)
            if newcomer is not None:
                self.granted[newcomer] = now
                self.probation = newcomer
                granted.append(newcomer)
        return granted

    def next_request(self, queue: OrderedDict[bytes, tuple[float, str, float]], seen: float,
                     skip: OrderedDict[bytes, None] | None = None, newest: bool = False) -> bytes | None:
        """The oldest (`newest`: the newest) living request in `queue` not in `skip`, of a key other
        than the last one served if one is among the next few, taken out of the queue; requests not
        renewed within the TTL are dropped on the way."""
        first: bytes | None = None
        chosen: bytes | None = None
        looked = 0
        for actor, (renewed, key, _) in list(reversed(queue.items()) if newest else queue.items()):
            if seen - renewed > self.timeouts.request_ttl_s:
                del queue[actor]  # not renewed: gone
                continue
            if skip is not None and actor in skip:
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

    def idle_requests(self, seen: float) -> int:
        """Identities holding requests they do not use: idle ones, and newcomers waiting
        IDLE_AFTER_S without a rollout."""
        return sum(actor in self.idle or seen - first >= IDLE_AFTER_S
                   for actor, (_, _, first) in self.new_waiting.items())


def remember(known: OrderedDict[bytes, None], actor: bytes) -> None:
    known[actor] = None
    known.move_to_end(actor)
    if len(known) > MAX_KNOWN:
        known.popitem(last=False)
