"""Dict and Tuple observations: one byte record per step, each part's bytes in its own dtype.

A composite observation (goal-conditioned robotics' observation/achieved_goal/desired_goal, an
image beside a vector) is packed where the env gives it: every vector env of such an env is
wrapped in `PackedObservations`, so the collector, the wire, PPO's batches, the replay and the
run's evaluations move one uint8 array, as for any Box. A uint8 image stays one byte a pixel and a
float32 vector keeps its bits; the networks read the parts back (`schema.obs_features`) and send
an image part through the convolutional encoder, the rest past it to the heads (SB3's
`CombinedExtractor`).

The parts' order: the largest three-dimensional part first (the image the encoder reads, at the
front of the features), the others as the space lists them. Box parts only: a Discrete or nested
part is refused, naming `gymnasium.wrappers.FlattenObservation` (which one-hot encodes it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlmq.common.schema import MAX_OBS_DIMS, ObsPart


def travel_dtype(dtype: np.dtype[Any]) -> str:
    """How a Box's values travel: floats as float32, bytes as bytes, other integers as int64."""
    return {"f": "float32", "b": "bool"}.get(dtype.kind, "uint8" if dtype == np.uint8 else "int64")


def plan_parts(space: gym.Space[Any], env_id: str) -> tuple[ObsPart, ...]:
    """The parts of a Dict or Tuple observation space, in packing order; ValueError naming what
    works for a part that is not a Box of 1 to MAX_OBS_DIMS dimensions."""
    named = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)  # type: ignore[attr-defined]
    parts = []
    for name, part in named:
        if not isinstance(part, gym.spaces.Box) or not 1 <= len(part.shape) <= MAX_OBS_DIMS:
            raise ValueError(
                f"{env_id}: observation part {name!r} ({part}) is not a Box of 1 to {MAX_OBS_DIMS} "
                "dimensions, which a Dict or Tuple observation's parts must be; wrap the env in "
                "gymnasium.wrappers.FlattenObservation to flatten it"
            )
        parts.append(ObsPart(str(name), tuple(int(d) for d in part.shape), travel_dtype(np.dtype(part.dtype))))
    images = [p for p in parts if len(p.shape) == 3]
    if images:
        image = max(images, key=lambda p: p.size)
        parts = [image, *(p for p in parts if p is not image)]
    return tuple(parts)


def pack(obs: Mapping[str, Any] | Sequence[Any], parts: Sequence[ObsPart], batch: int | None) -> np.ndarray:
    """A composite observation (`batch` None: one, [record bytes]) or a batch of them ([batch,
    record bytes]) as records of the parts' bytes; ValueError for one whose parts do not fit."""
    rows = 1 if batch is None else batch
    out = np.empty((rows, sum(p.nbytes for p in parts)), np.uint8)
    start = 0
    for part in parts:
        key = part.name if isinstance(obs, Mapping) else int(part.name)
        values = np.ascontiguousarray(np.asarray(obs[key]), dtype=part.dtype)  # type: ignore[index]
        if values.size != rows * part.size:
            raise ValueError(f"observation part {part.name!r} has shape {values.shape}, not {list(part.shape)}")
        out[:, start : start + part.nbytes] = values.reshape(rows, part.size).view(np.uint8)
        start += part.nbytes
    return out[0] if batch is None else out


class PackedObservations(gym.vector.VectorObservationWrapper):
    """A vector env of Dict or Tuple observations whose observations are records of bytes."""

    def __init__(self, env: gym.vector.VectorEnv, env_id: str) -> None:
        super().__init__(env)
        self.parts = plan_parts(env.single_observation_space, env_id)
        record = sum(p.nbytes for p in self.parts)
        self.single_observation_space = gym.spaces.Box(0, 255, (record,), np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, (env.num_envs, record), np.uint8)

    def observations(self, observations: Any) -> np.ndarray:
        return pack(observations, self.parts, self.num_envs)
