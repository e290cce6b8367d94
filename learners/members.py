"""What a learner rank keeps per population member: queued rollouts, credits, policy version.

Each member has its own credit ledger (credits.py), so one member's actors cannot crowd out
another's, and its own version, which counts the updates it took part in. A rank is *ready* to
update when every member has a batch queued, or when some member has one that has waited
`wait_s` (members without actors, or slower ones, must not stall the rest). A batch is at least
`rollouts_per_batch` rollouts and takes every one queued up to `most_per_batch` (learner batching:
more actors, larger batches). A batch that has waited `rank_wait_s` makes the rank *overdue*: the
world then updates at once, the ranks without data on an empty batch (learner.py).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import NamedTuple

from rlmq.common import wire
from rlmq.learners.credits import CreditLedger, CreditTimeouts


class Taken(NamedTuple):
    rollouts: list[list[wire.Rollout]]  # per member; empty for a member without a batch
    lags: list[int]  # policy lag of each rollout taken


class MemberQueues:
    def __init__(
        self,
        population: int,
        budget: int,
        timeouts: CreditTimeouts,
        rollouts_per_batch: int,
        max_policy_lag: int,
        wait_s: float,
        rank_wait_s: float,
        most_per_batch: int = 0,
    ) -> None:
        self.population, self.need, self.max_lag = population, rollouts_per_batch, max_policy_lag
        self.most = max(most_per_batch, rollouts_per_batch)
        self.wait_s, self.rank_wait_s = wait_s, rank_wait_s
        self.queues: list[collections.deque[tuple[float, wire.Rollout]]] = [
            collections.deque() for _ in range(population)
        ]
        self.ledgers = [CreditLedger(budget, timeouts, most_per_batch) for _ in range(population)]
        self.versions = [0] * population
        self.oldest_allowed = [0] * population  # data from before a PBT copy is another policy's
        self.read_at = time.monotonic()

    def check(self, member: int) -> None:
        if not 0 <= member < self.population:
            raise wire.WireError("unknown_member", f"member {member} of {self.population}")

    def hello(self, actor: bytes, member: int, name: str = "", key: str = "") -> None:
        self.check(member)
        self.ledgers[member].hello(actor, time.monotonic(), name, key)

    def idle_requests(self) -> int:
        """Identities holding credit requests they do not use (credits.py), over the members."""
        return sum(ledger.idle_requests() for ledger in self.ledgers)

    def spend(self, actor: bytes, member: int) -> None:
        """A rollout for `member` arrived from `actor`: its credit is spent, whatever the rollout
        turns out to hold (the actor thinks so too, and asks for the next)."""
        self.check(member)
        if not self.ledgers[member].delivered(actor, time.monotonic(), len(self.queues[member])):
            # the budget holds only if credits are enforced
            raise wire.WireError("no_credit", f"a rollout for member {member} without a credit")

    def enqueue(self, rollout: wire.Rollout) -> None:
        self.queues[rollout.member].append((time.monotonic(), rollout))

    def drained(self) -> None:
        """The socket was read just now: rollouts and renewed requests sent before are in."""
        self.read_at = time.monotonic()

    def grant(self, send: Callable[[bytes, int], None]) -> None:
        """Hand out the credits due: `send(actor, member)` for each. The ledgers' clock is the time
        the socket was last read: after a stall of the learner's own (a long update, a collective)
        a credit whose rollout waits unread is not late, nor is a request whose renewal waits."""
        now = time.monotonic()
        for member, ledger in enumerate(self.ledgers):
            for actor in ledger.grant(now, len(self.queues[member]), self.read_at):
                send(actor, member)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def drop_stale(self) -> int:
        """Drop rollouts too old to learn from from the head of each queue; how many."""
        dropped = 0
        for member, queue in enumerate(self.queues):
            version, oldest = self.versions[member], self.oldest_allowed[member]
            while queue and (
                version - queue[0][1].policy_version > self.max_lag or queue[0][1].policy_version < oldest
            ):
                queue.popleft()
                dropped += 1
        return dropped

    def batch_sizes(self) -> list[int]:
        """Rollouts in each member's next batch: every one queued, up to `most`; 0 for a member
        with fewer than a batch."""
        return [min(len(q), self.most) if len(q) >= self.need else 0 for q in self.queues]

    def batch_samples(self) -> list[int]:
        """Valid env steps in each member's next batch (what its loss is averaged over); 0 for a
        member without one."""
        return [
            sum(int(q[i][1].valid.sum()) for i in range(size))
            for q, size in zip(self.queues, self.batch_sizes(), strict=True)
        ]

    def ready(self) -> bool:
        with_batch = sum(len(q) >= self.need for q in self.queues)
        return with_batch == self.population or self.waited(self.wait_s)

    def overdue(self) -> bool:
        """A batch has waited `rank_wait_s`: the world must not wait any longer for other ranks."""
        return self.waited(self.rank_wait_s)

    def waited(self, seconds: float) -> bool:
        now = time.monotonic()
        return any(len(q) >= self.need and now - q[0][0] >= seconds for q in self.queues)

    def peek(self) -> list[list[wire.Rollout]]:
        """What `take` would take now, left queued."""
        return [[queue[i][1] for i in range(size)] for queue, size in zip(self.queues, self.batch_sizes(), strict=True)]

    def take(self) -> Taken:
        rollouts, lags = [], []
        for member, (queue, size) in enumerate(zip(self.queues, self.batch_sizes(), strict=True)):
            batch = [queue.popleft()[1] for _ in range(size)]
            # negative lag: data collected before a restart, with the weights the world resumed from
            lags += [max(self.versions[member] - r.policy_version, 0) for r in batch]
            rollouts.append(batch)
        return Taken(rollouts, lags)

    def replaced(self, member: int) -> None:
        """A PBT copy gave `member` other weights: a new version, and nothing older accepted."""
        self.versions[member] += 1
        self.oldest_allowed[member] = self.versions[member]
        self.queues[member].clear()
