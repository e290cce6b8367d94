"""What an environment's data look like, declared once: its spaces (`EnvSpec`) and the arrays of a
rollout, with their shapes from the spec and their dtypes (`rollout_layout`).

The collector allocates a rollout from the layout, the wire checks a `Rollout`'s dtypes against
`ROLLOUT_DTYPES`, the learner checks every rollout against its run's layout, PPO joins rollouts
into it and the replay stores observations as it says (as TorchBeast's `create_buffers` does).

Observations travel and are stored in their own dtype: a `uint8` image stays bytes on the wire and
in replay, and becomes float only inside the networks (`obs_features`). Floating observations
travel as float32, the networks' dtype (MuJoCo's float64 would double every rollout's bytes). A
Discrete observation is its index (int64, shape ()), one-hot encoded by the networks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

R = TypeVar("R")  # a rollout (common/wire.py, which imports this module)

# The dtypes an observation may travel in: floats as float32, integer Boxes as int64.
OBS_DTYPES = ("float32", "uint8", "int64", "bool")
MAX_OBS_DIMS = 4  # a rollout adds time and slot dimensions in front (the wire's MAX_ARRAY_DIMS)


@dataclass(frozen=True)
class ObsPart:
    """One key of a Dict (or Tuple) observation. A composite observation travels as one byte
    record per step, each part's bytes in its own dtype, in the spec's order (common/composite.py):
    a uint8 image stays bytes, a float32 vector stays exact, and every layer that moves
    observations moves one array. The networks read the parts back (`obs_features`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # one of OBS_DTYPES

    def __post_init__(self) -> None:
        if self.dtype not in OBS_DTYPES or min(self.shape, default=1) < 1 or len(self.shape) > MAX_OBS_DIMS:
            raise ValueError(f"observation part {self.name!r}: {self.dtype}{list(self.shape)} is not supported")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class EnvSpec:
    """The spaces of the environment, as the networks need them (probed by the coordinator)."""

    obs_shape: tuple[int, ...]  # one observation's shape: () for a Discrete observation
    action_kind: str  # "discrete" | "continuous"
    action_dim: int  # number of actions (discrete) or action-vector length (continuous)
    action_low: tuple[float, ...] = ()  # continuous bounds; empty when unbounded
    action_high: tuple[float, ...] = ()
    obs_dtype: str = "float32"  # one of OBS_DTYPES
    obs_categories: int = 0  # a Discrete observation's number of values (one-hot encoded); 0: a Box
    # Frames stacked along the observation's first axis (gymnasium's FrameStackObservation, as in
    # Atari's preprocessing); 1: none. The replay stores each frame once (learners/frames.py).
    frame_stack: int = 1
    # A Dict or Tuple observation's parts, in the order their bytes lie in each step's record
    # (obs_shape (record bytes,), obs_dtype uint8); empty for any other observation.
    obs_parts: tuple[ObsPart, ...] = ()

    def __post_init__(self) -> None:
        if len(self.obs_shape) > MAX_OBS_DIMS or min(self.obs_shape, default=1) < 1 or self.action_dim < 1:
            raise ValueError(
                f"obs_shape {self.obs_shape} (at most {MAX_OBS_DIMS} positive dims) or "
                f"action_dim {self.action_dim} (positive) out of range"
            )
        if self.obs_dtype not in OBS_DTYPES:
            raise ValueError(f"obs_dtype {self.obs_dtype!r} is not one of {', '.join(OBS_DTYPES)}")
        if self.obs_categories < 0 or self.obs_categories and (self.obs_shape, self.obs_dtype) != ((), "int64"):
            raise ValueError("a Discrete observation (obs_categories > 0) is an int64 of shape ()")
        if not self.obs_categories and not self.obs_shape:
            raise ValueError("a Box observation needs a shape")
        if self.frame_stack < 1 or self.frame_stack > 1 and self.obs_shape[:1] != (self.frame_stack,):
            raise ValueError(f"frame_stack {self.frame_stack} must be 1 or the first of obs_shape {self.obs_shape}")
        if self.obs_parts and (
            (self.obs_shape, self.obs_dtype) != ((sum(p.nbytes for p in self.obs_parts),), "uint8")
            or self.frame_stack != 1
        ):
            raise ValueError("a composite observation is one uint8 record of its parts' bytes, unstacked")
        if self.action_kind not in ("discrete", "continuous"):
            raise ValueError(f"action_kind must be discrete or continuous, not {self.action_kind!r}")
        if (
            len(self.action_low) != len(self.action_high)
            or self.action_low
            and (len(self.action_low) != self.action_dim or self.action_kind == "discrete")
        ):
            raise ValueError("action bounds must both be empty or both hold action_dim values")

    @property
    def obs_size(self) -> int:
        """The width of the networks' input: the flattened observation, or its one-hot code."""
        if self.obs_parts:
            return sum(part.size for part in self.obs_parts)
        return self.obs_categories or math.prod(self.obs_shape)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return () if self.action_kind == "discrete" else (self.action_dim,)

    @property
    def action_dtype(self) -> str:
        return "int64" if self.action_kind == "discrete" else "float32"


def rollout_layout(spec: EnvSpec, steps: int, slots: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """name → (shape, dtype) of every array of a rollout of `steps` vector steps of `slots` slots,
    time-major; `obs` has one more row, the observation to bootstrap from."""
    step = (steps, slots)
    return {
        "obs": ((steps + 1, slots, *spec.obs_shape), spec.obs_dtype),
        "actions": ((*step, *spec.action_shape), spec.action_dtype),
        "logprobs": (step, "float32"),
        "rewards": (step, "float32"),
        "terminated": (step, "bool"),
        "truncated": (step, "bool"),
        "valid": (step, "bool"),
    }


def _every_dtype() -> dict[str, tuple[str, ...]]:
    """name → the dtypes a rollout's array may have under some env spec (what the wire checks)."""
    specs = [
        EnvSpec(obs_shape=(1,), obs_dtype=dtype, action_kind=kind, action_dim=1)
        for dtype in OBS_DTYPES
        for kind in ("discrete", "continuous")
    ]
    layouts = [rollout_layout(spec, 1, 1) for spec in specs]
    return {name: tuple(sorted({layout[name][1] for layout in layouts})) for name in layouts[0]}


def allocate(
    spec: EnvSpec, steps: int, slots: int, lead: tuple[int, ...] = (), zeros: bool = False
) -> dict[str, np.ndarray]:
    """Arrays for a rollout (with `lead` dimensions in front: PPO's [P, ...] batch)."""
    make = np.zeros if zeros else np.empty
    return {
        name: make((*lead, *shape), np.dtype(dtype))
        for name, (shape, dtype) in rollout_layout(spec, steps, slots).items()
    }


def side_by_side(
    per_member: Sequence[Sequence[R]], out: np.ndarray, piece: Callable[[int, R], np.ndarray]
) -> np.ndarray:
    """`out` [P, T, W, ...] with each member's rollouts joined along the slot axis of its row, in
    order: `piece(member, rollout)` [T, slots, ...] of each. What no rollout fills keeps its value
    (zeros: padding, and invalid where `out` is a validity mask). The one way rollouts are joined."""
    for member, rollouts in enumerate(per_member):
        start = 0
        for rollout in rollouts:
            part = piece(member, rollout)
            out[member, :, start : start + part.shape[1]] = part
            start += part.shape[1]
    return out


ROLLOUT_DTYPES = _every_dtype()


def layout_problem(arrays: dict[str, np.ndarray], spec: EnvSpec, steps: int, slots: int) -> tuple[str, str] | None:
    """(reason, detail) of how `arrays` (a rollout's, by name) differ from the layout, or of a value
    that would break a network (an action or a Discrete observation out of range); None if none."""
    for name, shape, dtype in _checked_layout(spec, steps, slots):
        array = arrays[name]
        if array.shape != shape or array.dtype != dtype:
            return (
                "bad_shape",
                f"{name} is {array.dtype}{list(array.shape)}, the run's rollouts hold {dtype}{list(shape)}",
            )
    if spec.action_kind == "discrete" and not _within(arrays["actions"], spec.action_dim):
        return "bad_value", "an action index out of range"
    if spec.obs_categories and not _within(arrays["obs"], spec.obs_categories):
        return "bad_value", "a Discrete observation out of range"
    return None


def core_state_problem(state: np.ndarray | None, size: int, slots: int) -> tuple[str, str] | None:
    """(reason, detail) of how a rollout's core state differs from the run's: none without a
    recurrent core (`size` 0), [slots, size] with one (the wire has checked its dtype); None if fine."""
    shape = None if state is None else list(state.shape)
    if (shape is None) != (size == 0) or shape is not None and shape != [slots, size]:
        want = f"float32[{slots}, {size}]" if size else "none"
        return "bad_shape", f"core_state is {shape or 'none'}, the run's rollouts hold {want}"
    return None


@functools.cache
def _checked_layout(spec: EnvSpec, steps: int, slots: int) -> tuple[tuple[str, tuple[int, ...], np.dtype], ...]:
    """`rollout_layout` as `layout_problem` checks every rollout against it: built once per run."""
    return tuple((name, shape, np.dtype(dtype)) for name, (shape, dtype) in rollout_layout(spec, steps, slots).items())


_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}


def _within(indices: np.ndarray, count: int) -> bool:
    """Whether every index lies in [0, count). Signed integers are read as unsigned, where a
    negative one is at least 2**(bits − 1), so past any smaller count: one pass instead of a min
    and a max (benchmarks/LOG.md §12)."""
    if indices.dtype.kind == "i" and count <= 1 << (8 * indices.dtype.itemsize - 1):
        indices = indices.view(_UNSIGNED[indices.dtype.itemsize])
    elif indices.dtype.kind != "u":
        return bool(indices.min(initial=0) >= 0 and indices.max(initial=0) < count)
    return bool(np.maximum.reduce(indices, axis=None, initial=0) < count)


# A member's running observation statistics travel inside its weights under these names, when the
# run normalizes observations (learners/normalization.py): mean, variance and count of the features'
# data so far, and the clip applied after normalizing (so that the weights alone say how to act).
OBS_NORM_KEYS = ("obs_norm.mean", "obs_norm.var", "obs_norm.count", "obs_norm.clip")
OBS_NORM_EPS = 1e-8


@dataclass(frozen=True)
class ObsNorm:
    """features → clip((features − mean) / std, ±clip), float32: how the actors, `rlmq eval` and
    `rlmq export` apply a member's statistics, as the learners do in torch."""

    mean: np.ndarray
    std: np.ndarray  # √(var + OBS_NORM_EPS)
    clip: float

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return np.clip((features - self.mean) / self.std, -self.clip, self.clip)


def obs_normalizer(params: dict[str, np.ndarray], size: int) -> ObsNorm | None:
    """The statistics in a member's weights, or None if they hold none; ValueError if they hold
    some of the keys only, or values that do not fit `size` features."""
    present = [key in params for key in OBS_NORM_KEYS]
    if not any(present):
        return None
    mean_key, var_key, count_key, clip_key = OBS_NORM_KEYS
    if not all(present):
        raise ValueError(f"observation statistics need all of {', '.join(OBS_NORM_KEYS)}")
    mean, var = np.asarray(params[mean_key], np.float64), np.asarray(params[var_key], np.float64)
    count, clip = np.asarray(params[count_key]), np.asarray(params[clip_key])
    if mean.shape != (size,) or var.shape != (size,) or count.shape != () or clip.shape != ():
        raise ValueError(f"observation statistics do not fit {size} features")
    if var.min() < 0 or count < 0 or not clip > 0:
        raise ValueError("observation statistics need var ≥ 0, count ≥ 0 and clip > 0")
    return ObsNorm(mean.astype(np.float32), np.sqrt(var + OBS_NORM_EPS).astype(np.float32), float(clip))


def obs_features(obs: np.ndarray, spec: EnvSpec) -> np.ndarray:
    """What the actors' NumPy policies take: [N, obs_size] float32 (a view where nothing changes);
    a composite observation's parts side by side, in the spec's order."""
    if spec.obs_parts:
        features, start = [], 0
        for part in spec.obs_parts:
            raw = np.ascontiguousarray(obs[:, start : start + part.nbytes])  # a view of other dtype needs it
            features.append(raw.view(part.dtype).reshape(len(obs), part.size).astype(np.float32, copy=False))
            start += part.nbytes
        return np.concatenate(features, axis=1)
    if spec.obs_categories:
        one_hot = np.zeros((len(obs), spec.obs_categories), np.float32)
        one_hot[np.arange(len(obs)), obs] = 1
        return one_hot
    return obs.reshape(len(obs), -1).astype(np.float32, copy=False)
