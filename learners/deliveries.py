"""What a learner took from each actor, for a secure run's check of actors' reports: the env steps
(valid steps) and episode ends of their rollouts, by actor name, as totals since this learner
process began. The coordinator counts an actor's reports no further than these reach
(coordinator/store.py).

Totals, not increments, so that no report is owed: a report dropped on a full control socket (a
coordinator cut off, rank 0's weights filling the queue) or repeated after a lost reply changes
nothing, since the next one says all again. The coordinator adds what a name's total grew by
since the last it heard under the same `session`, which this process draws at random."""

from __future__ import annotations

import collections
import random

import numpy as np

from rlmq.common import wire
from rlmq.common.codec import MAX_SEQUENCE

RESENT_PER_REPORT = 64  # names whose totals did not grow, sent again per report, in turn


class Deliveries:
    def __init__(self) -> None:
        self.session = random.SystemRandom().getrandbits(40) | 1  # 0 would mean "no session"
        self.steps: collections.Counter[str] = collections.Counter()
        self.episodes: collections.Counter[str] = collections.Counter()
        self.changed: dict[str, None] = {}  # names whose totals grew since they were last taken, in order
        self.names: list[str] = []  # every name, in order of first delivery: the round the rest go in
        self.cursor = 0

    def add(self, rollout: wire.Rollout) -> None:
        name = rollout.actor
        if name not in self.steps:
            self.names.append(name)
        self.steps[name] += int(np.count_nonzero(rollout.valid))
        self.episodes[name] += int(np.count_nonzero((rollout.terminated | rollout.truncated) & rollout.valid))
        self.changed[name] = None

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """(steps, episode ends) totals for a report: the names that grew since they were last
        taken, then RESENT_PER_REPORT of the others in turn, at most a report's worth (a flood of
        names cannot make a report the wire refuses). Every name comes round again, so a report
        lost after a name's last growth is made good."""
        chosen: dict[str, None] = {}
        while self.changed and len(chosen) < MAX_SEQUENCE:
            name = next(iter(self.changed))
            del self.changed[name]
            chosen[name] = None
        most = min(len(chosen) + RESENT_PER_REPORT, MAX_SEQUENCE)
        for _ in range(len(self.names)):
            if len(chosen) >= most:
                break
            name = self.names[self.cursor % len(self.names)]
            self.cursor = (self.cursor + 1) % len(self.names)
            chosen.setdefault(name)
        return {name: self.steps[name] for name in chosen}, {name: self.episodes[name] for name in chosen}
