"""What a learner rank keeps per population member: queued rollouts, credits, policy version.

Each member has its own credit ledger (credits.py), so one member's actors cannot crowd out
another's, and its own version, which counts the updates it took part in. A rank is *ready* to
update when every member has a batch queued, or when some member has one that has waited
`wait_s` (members without actors, or slower ones, must not stall the rest).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import NamedTuple

from rlmq.common import wire
from rlmq.learners.credits import CreditLedger


class Taken(NamedTuple):
    rollouts: list[list[wire.Rollout]]  # per member; empty for a member without a batch
    lags: list[int]  # policy lag of each rollout taken


class MemberQueues:
    def __init__(self, population: int, budget: int, credit_timeout_s: float, rollouts_per_batch: int,
                 max_policy_lag: int, wait_s: float) -> None:  # fmt: skip
        self.population, self.need, self.max_lag, self.wait_s = population, rollouts_per_batch, max_policy_lag, wait_s
        self.queues: list[collections.deque[tuple[float, wire.Rollout]]] = [
            collections.deque() for _ in range(population)]  # fmt: skip
        self.ledgers = [CreditLedger(budget, credit_timeout_s) for _ in range(population)]
        self.versions = [0] * population
        self.oldest_allowed = [0] * population  # data from before a PBT copy is another policy's

    def check(self, member: int) -> None:
        if not 0 <= member < self.population:
            raise wire.WireError("unknown_member", f"member {member} of {self.population}")

    def hello(self, actor: bytes, member: int) -> None:
        self.check(member)
        self.ledgers[member].hello(actor)

    def spend(self, actor: bytes, member: int) -> None:
        """A rollout for `member` arrived from `actor`: its credit is spent, whatever the rollout
        turns out to hold (the actor thinks so too, and asks for the next)."""
        self.check(member)
        ledger = self.ledgers[member]
        if not ledger.holds(actor):  # the budget holds only if credits are enforced
            raise wire.WireError("no_credit", f"a rollout for member {member} without a credit")
        ledger.delivered(actor)

    def enqueue(self, rollout: wire.Rollout) -> None:
        self.queues[rollout.member].append((time.monotonic(), rollout))

    def grant(self, send: Callable[[bytes, int], None]) -> None:
        """Hand out the credits due: `send(actor, member)` for each."""
        now = time.monotonic()
        for member, ledger in enumerate(self.ledgers):
            for actor in ledger.grant(now, queued=len(self.queues[member])):
                send(actor, member)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def drop_stale(self) -> int:
        """Drop rollouts too old to learn from from the head of each queue; how many."""
        dropped = 0
        for member, queue in enumerate(self.queues):
            version, oldest = self.versions[member], self.oldest_allowed[member]
            while queue and (version - queue[0][1].policy_version > self.max_lag or
                             queue[0][1].policy_version < oldest):  # fmt: skip
                queue.popleft()
                dropped += 1
        return dropped

    def batch_samples(self) -> list[int]:
        """Valid env steps in each member's next batch (what its loss is averaged over); 0 for a
        member without one."""
        return [sum(int(q[i][1].valid.sum()) for i in range(self.need)) if len(q) >= self.need else 0
                for q in self.queues]  # fmt: skip

    def ready(self) -> bool:
        with_batch = [q for q in self.queues if len(q) >= self.need]
        if len(with_batch) == self.population:
            return True
        return any(time.monotonic() - q[0][0] >= self.wait_s for q in with_batch)

    def take(self) -> Taken:
        rollouts, lags = [], []
        for member, queue in enumerate(self.queues):
            batch = [queue.popleft()[1] for _ in range(self.need)] if len(queue) >= self.need else []
            # negative lag: data collected before a restart, with the weights the world resumed from
            lags += [max(self.versions[member] - r.policy_version, 0) for r in batch]
            rollouts.append(batch)
        return Taken(rollouts, lags)

    def replaced(self, member: int) -> None:
        """A PBT copy gave `member` other weights: a new version, and nothing older accepted."""
        self.versions[member] += 1
        self.oldest_allowed[member] = self.versions[member]
        self.queues[member].clear()
