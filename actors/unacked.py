"""The finished episodes an actor has reported and the coordinator has not yet acknowledged.

Every report carries all of them (the coordinator counts each once, however often it comes), so
none is lost while the coordinator is away; beyond `most` the oldest are given up. Held as two
arrays, not a queue of tuples: a fast env ends thousands of episodes between two reports.
"""

from __future__ import annotations

import numpy as np


class UnackedEpisodes:
    def __init__(self, most: int) -> None:
        self.most = most
        self.returns, self.lengths = np.zeros(0, np.float64), np.zeros(0, np.int64)
        self.lineages = np.zeros(0, np.int64)  # `wire.ActorReport.episode_lineages`

    def __len__(self) -> int:
        return len(self.returns)

    def add(self, returns: np.ndarray, lengths: np.ndarray, lineages: np.ndarray | None = None) -> int:
        """Append newly finished episodes, oldest first; how many of the oldest were given up."""
        lineages = np.zeros(len(returns), np.int64) if lineages is None else lineages
        if not len(returns) == len(lengths) == len(lineages):
            raise ValueError(f"{len(returns)} returns against {len(lengths)} lengths and {len(lineages)} lineages")
        self.returns = np.concatenate((self.returns, np.asarray(returns, np.float64)))
        self.lengths = np.concatenate((self.lengths, np.asarray(lengths, np.int64)))
        self.lineages = np.concatenate((self.lineages, np.asarray(lineages, np.int64)))
        given_up = max(len(self.returns) - self.most, 0)
        self.keep_newest(self.most)
        return given_up

    def keep_newest(self, count: int) -> None:
        """Forget all but the newest `count`: the coordinator has counted the others."""
        drop = max(len(self.returns) - max(count, 0), 0)
        self.returns, self.lengths, self.lineages = self.returns[drop:], self.lengths[drop:], self.lineages[drop:]
