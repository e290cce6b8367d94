"""Frame stacks taken apart into frames, each frame once, and put back together.

An observation stacked from k frames along its first axis (`EnvSpec.frame_stack`: gymnasium's
FrameStackObservation, as Atari's preprocessing) shares k − 1 frames with the one a step before in
the same env slot. `stack_rows` lists a rollout's observations [T + 1, N, k, *frame] as frame rows,
slot by slot in time order: an observation whose first k − 1 frames are its predecessor's last
k − 1 adds one row (its newest frame); any other (a slot's first, an episode's first) adds all k.
Its key is the index of its last row, so every observation is the k rows ending at its key.
Continuation is read from the data by exact equality, never assumed: `unstack_rows` gives back
exactly what went in. With k = 1 every observation is one row.

Actors send Atari rollouts this way (`common/wire.py`: a quarter of the bytes), and the replay
stores frames this way (`learners/frames.py`: a transition's two observations are two keys).
"""

from __future__ import annotations

import numpy as np


def stack_rows(obs: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows [R, *frame], keys [N, T + 1]) of observations [T + 1, N, *obs] stacked from `depth`
    frames along their first axis (frame = obs[1:] when depth > 1, the whole observation at 1)."""
    steps, slots, obs_shape = obs.shape[0], obs.shape[1], obs.shape[2:]
    stacks = np.swapaxes(obs, 0, 1)  # [N, T + 1, ...]: slot by slot, in time order
    if depth == 1:
        return stacks.reshape(slots * steps, *obs_shape), np.arange(slots * steps).reshape(slots, steps)
    continues = np.zeros((slots, steps), bool)
    continues[:, 1:] = (stacks[:, 1:, :-1] == stacks[:, :-1, 1:]).reshape(slots, steps - 1, -1).all(-1)
    counts = np.where(continues.ravel(), 1, depth)
    ends = np.cumsum(counts)  # rows up to and including each observation's
    # Row r is frame `within` of observation `source`: the newest of one that continues, all k in
    # order of one that does not.
    source = np.repeat(np.arange(counts.size), counts)
    within = np.arange(int(ends[-1])) - np.repeat(ends - counts, counts) + np.repeat(depth - counts, counts)
    rows = stacks.reshape(slots * steps, *obs_shape)[source, within]
    return rows, (ends - 1).reshape(slots, steps)


def unstack_rows(rows: np.ndarray, keys: np.ndarray, depth: int) -> np.ndarray:
    """The observations [T + 1, N, *obs] that `stack_rows` took apart into `rows` and `keys`
    [N, T + 1]; keys must lie in [depth − 1, len(rows))."""
    by_time = keys.T  # gathered time-major, the result comes out contiguous
    if depth == 1:
        return rows[by_time]
    return rows[by_time[..., None] - np.arange(depth - 1, -1, -1)]
