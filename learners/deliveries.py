"""What a learner took from each actor, for a secure run's check of actors' reports: the env steps
(valid steps) and episode ends of their rollouts, by actor name, since the learner's last report.
The coordinator counts an actor's reports no further than these reach (coordinator/store.py)."""

from __future__ import annotations

import collections
import itertools

import numpy as np

from rlmq.common import wire
from rlmq.common.codec import MAX_SEQUENCE


class Deliveries:
    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()
        self.episodes: collections.Counter[str] = collections.Counter()

    def add(self, rollout: wire.Rollout) -> None:
        self.steps[rollout.actor] += int(np.count_nonzero(rollout.valid))
        self.episodes[rollout.actor] += int(np.count_nonzero((rollout.terminated | rollout.truncated) & rollout.valid))

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """(steps, episode ends) for a report: at most a report's worth of names (the rest go with
        the next), so that a flood of names cannot make a report the wire refuses."""
        names = list(itertools.islice(self.steps, MAX_SEQUENCE))
        return ({name: self.steps.pop(name) for name in names},
                {name: self.episodes.pop(name, 0) for name in names})
