"""Credit-based flow control: how a learner rank keeps the data it has not trained on bounded.

An actor may send a rollout to a learner only when it holds a credit from it. The learner grants
credits, oldest-waiting actor first, while (credits out) + (rollouts queued) < budget. So however
many actors there are, at most `budget` rollouts exist for this learner at once, and the policy lag
stays near budget / rollouts-per-update instead of growing with the actor count and the socket
buffers. The learner drops a rollout from an actor that holds no credit, so the bound is enforced,
not hoped for. A credit unused for `timeout_s` (its actor died) is taken back. Pure bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict


class CreditLedger:
    def __init__(self, budget: int, timeout_s: float) -> None:
        self.budget, self.timeout_s = budget, timeout_s
        self.waiting: OrderedDict[bytes, None] = OrderedDict()  # actors without a credit, FIFO
        self.granted: dict[bytes, float] = {}  # actor → when its one credit was granted

    @property
    def in_flight(self) -> int:
        return len(self.granted)

    def holds(self, actor: bytes) -> bool:
        return actor in self.granted

    def hello(self, actor: bytes) -> None:
        """The actor wants credit (it is new, or we restarted and forgot it). If our ledger says
        it holds one, that credit may still be on its way: leave it to arrive or to time out.
        (A restarted actor has a new socket identity, so it is a new actor here.)"""
        if actor not in self.granted:
            self.waiting[actor] = None

    def delivered(self, actor: bytes) -> None:
        """A rollout arrived; the actor wants the next credit."""
        self.granted.pop(actor, None)
        self.waiting[actor] = None

    def grant(self, now: float, queued: int) -> list[bytes]:
        """Actors to send one credit each, now. `queued`: rollouts received but not yet trained."""
        for actor, since in list(self.granted.items()):
            if now - since > self.timeout_s:
                del self.granted[actor]  # it will say hello again if it is still alive
        granted = []
        while self.waiting and self.in_flight + queued < self.budget:
            actor, _ = self.waiting.popitem(last=False)
            self.granted[actor] = now
            granted.append(actor)
        return granted
