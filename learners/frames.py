"""The observations a replay shard holds, each stored once, and each frame of a frame stack once.

A transition needs its observation and the one it bootstraps from; storing both with every
transition keeps each observation twice, and for Atari's stacks of 4 frames each frame 8 times:
100 k transitions of [4, 84, 84] bytes would take 5.6 GB. Here each member's observations are rows
of one ring, laid out by `common/frames.py` (slot by slot in time order, a stack that continues its
predecessor adding only its newest frame), and a transition keeps two keys into it.

The ring is preallocated, so its memory is the bound: `rows` rows of one frame. When a member's
rows wrap, the oldest observations are overwritten; keys below `intact_from` are gone, and the
replay drops the transitions that point at them.
"""

from __future__ import annotations

import numpy as np

from rlmq.common.frames import stack_rows
from rlmq.common.schema import EnvSpec


class FrameRing:
    """Each member's observations as rows of one ring buffer, vectorized over members."""

    STATE = ("_rows", "_written")  # what a checkpoint saves (learners/checkpoint.py)

    def __init__(self, population: int, rows: int, spec: EnvSpec) -> None:
        if rows < spec.frame_stack:
            raise ValueError(f"FrameRing needs at least {spec.frame_stack} rows, got {rows}")
        self.depth, self.rows = spec.frame_stack, rows
        row_shape = spec.obs_shape[1:] if self.depth > 1 else spec.obs_shape
        self._rows = np.zeros((population, rows, *row_shape), np.dtype(spec.obs_dtype))
        self._written = np.zeros(population, np.int64)  # rows each member ever wrote

    @property
    def nbytes(self) -> int:
        return int(self._rows.nbytes)

    def add(self, member: int, obs: np.ndarray) -> np.ndarray:
        """Store a rollout's observations [T + 1, N, *obs_shape]; return their keys [N, T + 1]."""
        new_rows, keys = stack_rows(obs, self.depth)
        keys = keys + self._written[member]
        written = len(new_rows)
        if written > self.rows:  # only the newest `rows` would survive the wrap anyway
            new_rows = new_rows[-self.rows :]
        start = self._written[member] + written - len(new_rows)
        self._rows[member, (start + np.arange(len(new_rows))) % self.rows] = new_rows
        self._written[member] += written
        return keys

    def written(self, member: int) -> int:
        """Rows `member` ever wrote."""
        return int(self._written[member])

    def intact_from(self, member: int) -> int:
        """The smallest key whose observation is still whole in `member`'s rows."""
        return self.written(member) - self.rows + self.depth - 1

    def gather(self, members: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """The observations [P, B, *obs_shape] of `keys` [P, B] into the rows of `members` [P, B]."""
        if self.depth == 1:
            return self._rows[members, keys % self.rows]
        frames = (keys[..., None] - np.arange(self.depth - 1, -1, -1)) % self.rows
        return self._rows[members[..., None], frames]

    def copy_member(self, source: int, target: int) -> None:
        self._rows[target] = self._rows[source]
        self._written[target] = self._written[source]
