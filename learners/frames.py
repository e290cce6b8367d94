"""The observations a replay shard holds, each stored once, and each frame of a frame stack once.

A transition needs its observation and the one it bootstraps from; storing both with every
transition keeps each observation twice, and for Atari's stacks of 4 frames each frame 8 times:
100 k transitions of [4, 84, 84] bytes would take 5.6 GB. Here each member's observations are rows
of one ring, written env slot by env slot in time order, and a transition keeps two keys into it.

An observation stacked from k frames (`EnvSpec.frame_stack`, gymnasium's FrameStackObservation)
whose first k − 1 frames are its predecessor's last k − 1 (the same env slot a step later) takes one
row, its newest frame; one that does not (an episode's first, a rollout's first) takes all k. Every
observation is then the k consecutive rows ending at its key. Whether a stack continues is read from
the data (exact equality), never assumed, so what comes out is always what went in. Any other
observation (k = 1) is one row of its own.

The ring is preallocated, so its memory is the bound: `rows` rows of one frame. When a member's
rows wrap, the oldest observations are overwritten; keys below `intact_from` are gone, and the
replay drops the transitions that point at them.
"""

from __future__ import annotations

import numpy as np

from rlmq.common.schema import EnvSpec


class FrameRing:
    """Each member's observations as rows of one ring buffer, vectorized over members."""

    def __init__(self, population: int, rows: int, spec: EnvSpec) -> None:
        if rows < spec.frame_stack:
            raise ValueError(f"FrameRing needs at least {spec.frame_stack} rows, got {rows}")
        self.depth, self.rows = spec.frame_stack, rows
        self.obs_shape = spec.obs_shape
        row_shape = spec.obs_shape[1:] if self.depth > 1 else spec.obs_shape
        self._rows = np.zeros((population, rows, *row_shape), np.dtype(spec.obs_dtype))
        self._written = np.zeros(population, np.int64)  # rows each member ever wrote

    @property
    def nbytes(self) -> int:
        return int(self._rows.nbytes)

    def add(self, member: int, obs: np.ndarray) -> np.ndarray:
        """Store a rollout's observations [T + 1, N, *obs_shape]; return their keys [N, T + 1]."""
        steps, slots = obs.shape[:2]
        by_slot = np.swapaxes(obs, 0, 1).reshape(slots * steps, *self.obs_shape)  # slot-major, time order
        k = self.depth
        if k > 1:
            stacks = by_slot.reshape(slots, steps, *self.obs_shape)
            continues = np.zeros((slots, steps), bool)
            continues[:, 1:] = (stacks[:, 1:, :-1] == stacks[:, :-1, 1:]).reshape(slots, steps - 1, -1).all(-1)
            counts = np.where(continues.ravel(), 1, k)
        else:
            counts = np.ones(slots * steps, np.int64)
        ends = np.cumsum(counts)  # rows written up to and including each observation
        keys = self._written[member] + ends - 1
        # Row r copies frame `within` of observation `source`: the last for one that continues,
        # all k in order for one that does not.
        source = np.repeat(np.arange(counts.size), counts)
        within = np.arange(int(ends[-1])) - np.repeat(ends - counts, counts) + np.repeat(k - counts, counts)
        new_rows = by_slot[source, within] if k > 1 else by_slot[source]
        if len(new_rows) > self.rows:  # only the newest `rows` would survive the wrap anyway
            new_rows = new_rows[-self.rows :]
        start = self._written[member] + ends[-1] - len(new_rows)
        self._rows[member, (start + np.arange(len(new_rows))) % self.rows] = new_rows
        self._written[member] += int(ends[-1])
        return keys.reshape(slots, steps)

    def written(self, member: int) -> int:
        """Rows `member` ever wrote."""
        return int(self._written[member])

    def intact_from(self, member: int) -> int:
        """The smallest key whose observation is still whole in `member`'s rows."""
        return self.written(member) - self.rows + self.depth - 1

    def gather(self, keys: np.ndarray) -> np.ndarray:
        """The observations [P, B, *obs_shape] of per-member keys [P, B]."""
        member = np.arange(keys.shape[0])[:, None]
        if self.depth == 1:
            return self._rows[member, keys % self.rows]
        frames = (keys[..., None] - np.arange(self.depth - 1, -1, -1)) % self.rows
        return self._rows[member[..., None], frames]

    def copy_member(self, source: int, target: int) -> None:
        self._rows[target] = self._rows[source]
        self._written[target] = self._written[source]
