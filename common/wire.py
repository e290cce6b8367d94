"""The rlmq wire protocol: every message, the one `encode`/`decode` pair, the one `WireError`.

A message travels as one msgpack frame: ``[PROTOCOL_VERSION, kind, {field: value}]``. Arrays
travel as ``[dtype, shape, raw bytes]`` (one frame beats multipart below 64 KB, measured); a
rollout of frame stacks sends each frame once (common/frames.py) and is whole again once decoded.
Decoding is driven by the dataclass annotations below, so what a field may hold is declared exactly
once; every failure (garbage, truncation, wrong version, unknown kind or field, wrong type, dtype
outside the allow-list, shape × itemsize ≠ length, oversize, NaN/inf) raises `WireError`. Nothing
here ever unpickles.

Topology (who sends what to whom, see docs/architecture.md):

    actor, learner  DEALER → coordinator ROUTER   Hello, ActorReport, LearnerReport, Weights,
                                                  LearnerHeartbeat (a learner's own thread)
    coordinator     ROUTER → actor, learner       Assign
    actor           DEALER → learner ROUTER       Hello (a request for credit, renewed while waiting),
                                                  Rollout (one per credit)
    learner         ROUTER → actor                Credit
    coordinator     PUB    → actors, learner 0    Weights (topic "w{member}."), Directive ("ctl."),
                                                  Decision ("pbt.", to learner 0)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

import msgpack
import numpy as np

from rlmq.common.config import ALGORITHMS, ALL_TUNABLE, RunConfig, hyperparam_problems
from rlmq.common.frames import stack_rows, unstack_rows
from rlmq.common.schema import MAX_OBS_DIMS, ROLLOUT_DTYPES, EnvSpec

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024
MAX_STR_CHARS = 4096
MAX_SEQUENCE = 4096
MAX_ARRAY_DIMS = MAX_OBS_DIMS + 2  # a rollout's observations: time and slot, then the observation's
ALLOWED_DTYPES = frozenset({"float32", "float64", "int64", "int32", "uint8", "bool"})
INT64_RANGE = (-(2**63), 2**63 - 1)  # what an int field may hold
MAX_COUNT = 2**40  # bound on counters in reports: a hostile report must not overflow a sum
# An actor waiting for a learner's credit repeats its Hello this often; a learner forgets a request
# not renewed for its TTL (learners/credits.py), so dead and stray identities lose their place.
CREDIT_REQUEST_RENEW_S = 0.25
CREDIT_REQUEST_TTL_S = 1.0


@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, remembered: NumPy builds the string on every call (~1.7 µs here; a rollout's
    seven arrays are named when it is built and when it is encoded). Few dtypes ever reach it:
    decoded arrays come only in ALLOWED_DTYPES."""
    return dtype.name


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise WireError("bad_value", detail)


def _counts(message: object, *names: str) -> None:
    for name in names:
        value = getattr(message, name)
        _require(0 <= value <= MAX_COUNT, f"{type(message).__name__}.{name} = {value} outside [0, 2^40]")


class WireError(ValueError):
    """A frame that is not a valid rlmq message. Services count it, drop it and carry on."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason  # a short label, used as the `reason` of the rejected-messages metric


Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class Hello:
    """A process announces itself to the coordinator (and again after any restart)."""

    role: str  # "actor" | "learner"
    name: str
    pid: int
    rank: int = -1  # learner rank; -1 for actors
    experience_endpoint: str = ""  # where actors reach a learner's experience (ROUTER) socket
    metrics_port: int = 0
    member: int = -1  # an actor greeting a learner: the member it collects for; -1: not yet assigned

    def __post_init__(self) -> None:
        _require(self.role in ("actor", "learner"), f"Hello.role must be actor or learner, not {self.role!r}")
        _require(bool(self.name), "Hello.name is empty")
        _require(self.rank >= -1 and self.member >= -1, "Hello.rank or Hello.member below -1")
        _counts(self, "pid", "metrics_port")


@dataclass(frozen=True)
class Weights:
    """Parameters of one population member at one policy version."""

    member: int
    version: int
    params: Params
    final: bool = False  # the learner's last publication before it stops
    # Env steps the member has trained on: actors derive exploration schedules from it (ε, noise).
    trained_steps: int = 0

    def __post_init__(self) -> None:
        _require(bool(self.params), "Weights.params is empty")
        _counts(self, "member", "version", "trained_steps")


@dataclass(frozen=True)
class Assign:
    """The coordinator's answer to Hello: what to run, where experience goes, current weights."""

    run: str
    member: int
    actor_index: int
    config: RunConfig
    env_spec: EnvSpec
    learner_endpoints: tuple[str, ...]
    weights: Weights | None = None  # the actor's member's
    # For learners: every member's hyperparameters and latest weights, and the id of the last PBT
    # decision already applied to them.
    hyperparams: tuple[dict[str, float], ...] = ()
    member_weights: tuple[Weights, ...] = ()
    applied_decision: int = 0

    def __post_init__(self) -> None:
        _require(len(self.hyperparams) in (0, self.config.population), "Assign.hyperparams: one per member")
        tunable = set(ALGORITHMS[self.config.algo].tunable)
        _require(all(set(h) == tunable for h in self.hyperparams), "Assign.hyperparams: the algorithm's tunables")
        _require(not any(hyperparam_problems(h) for h in self.hyperparams), "Assign.hyperparams out of bounds")
        _require(all(0 <= w.member < self.config.population for w in self.member_weights), "Assign: member")
        _counts(self, "applied_decision")


@dataclass(frozen=True)
class Rollout:
    """T steps of N vector-env slots, time-major. ``obs`` has T + 1 rows (the bootstrap row).

    ``valid`` is False for the step a Gymnasium next-step autoreset spends resetting a slot. Shapes
    and dtypes as `common/schema.py` lays them out: checked here as far as they fit together, and
    by the learner against its run's env spec.
    """

    member: int
    policy_version: int
    actor: str
    obs: np.ndarray
    actions: np.ndarray
    logprobs: np.ndarray  # under the behaviour policy
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    sequence: int = 0  # the actor's rollouts numbered 1, 2, ... (a restarted actor starts again); 0: none
    # Frames each observation stacks along its first axis (EnvSpec.frame_stack): above 1, `encode`
    # sends each frame once, as rows and a key per observation, and `decode` rebuilds the stacks.
    frame_stack: int = 1

    def __post_init__(self) -> None:
        _counts(self, "sequence")
        if self.obs.ndim < 2:
            raise WireError("bad_shape", f"Rollout.obs must be [T+1, N, ...], got {self.obs.shape}")
        if self.frame_stack < 1 or self.frame_stack > 1 and self.obs.shape[2:3] != (self.frame_stack,):
            raise WireError("bad_shape", f"Rollout.frame_stack {self.frame_stack} is not obs's third axis")
        steps, slots = self.obs.shape[0] - 1, self.obs.shape[1]
        if steps < 1 or slots < 1:
            raise WireError("bad_shape", "Rollout must hold at least one step of one slot")
        for name in ("logprobs", "rewards", "terminated", "truncated", "valid"):
            if getattr(self, name).shape != (steps, slots):
                raise WireError("bad_shape", f"Rollout.{name} must be {(steps, slots)}")
        if self.actions.shape[:2] != (steps, slots):
            raise WireError("bad_shape", f"Rollout.actions must start with {(steps, slots)}")
        for name, dtypes in ROLLOUT_DTYPES.items():
            if _dtype_name(getattr(self, name).dtype) not in dtypes:
                raise WireError("bad_dtype", f"Rollout.{name} must be {' or '.join(dtypes)}")

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)


@dataclass(frozen=True)
class ActorReport:
    """An actor's heartbeat: env steps since its last report and the episodes it finished."""

    name: str
    member: int
    env_steps: int
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    episode_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    policy_version: int = 0
    rejected: int = 0  # malformed messages this actor dropped since its last report
    first_step_at: float = 0.0  # unix time of this actor's first env step; 0 before it

    def __post_init__(self) -> None:
        _counts(self, "member", "env_steps", "rejected")
        _require(self.policy_version >= -1 and self.first_step_at >= 0, "ActorReport: negative field")
        returns, lengths = self.episode_returns, self.episode_lengths
        _require(returns.ndim == 1 and returns.dtype.name == "float64", "episode_returns must be 1-D float64")
        _require(lengths.shape == returns.shape and lengths.dtype.name == "int64",
                 "episode_lengths must be int64 and match episode_returns")  # fmt: skip


@dataclass(frozen=True)
class LearnerReport:
    """A learner rank's heartbeat: progress since its last report."""

    name: str
    rank: int
    policy_version: int
    updates: int
    samples: int
    stale_dropped: int
    mean_policy_lag: float
    rejected: int = 0
    applied_decision: int = 0  # the id of the last PBT decision this rank applied
    nonfinite_skipped: int = 0  # member steps skipped since the last report: gradient not finite

    def __post_init__(self) -> None:
        _counts(self, "rank", "policy_version", "updates", "samples", "stale_dropped", "rejected",
                "applied_decision", "nonfinite_skipped")
        _require(self.mean_policy_lag >= 0, "LearnerReport.mean_policy_lag is negative")


@dataclass(frozen=True)
class LearnerHeartbeat:
    """A learner rank's pulse, sent every HEARTBEAT_PERIOD_S by a thread of its own, so that a rank
    waiting in a collective still beats: how far its loop got, and how long it has been in the
    synchronised part of its iteration (agreement and update). From these the coordinator names
    a rank that holds the world up (coordinator/stragglers.py)."""

    name: str
    rank: int
    iteration: int
    waiting_s: float  # 0: not in the synchronised part now

    def __post_init__(self) -> None:
        _counts(self, "rank", "iteration")
        _require(0 <= self.waiting_s <= MAX_COUNT, "LearnerHeartbeat.waiting_s outside [0, 2^40]")


HEARTBEAT_PERIOD_S = 1.0


@dataclass(frozen=True)
class Credit:
    """Learner → actor: you may send me `count` more rollouts (flow control, learners/credits.py).

    `policy_version` is the learner's version now: the actor collects with those weights, which the
    learner sends just ahead of the credit (once per actor and version) and the broadcast later.
    """

    count: int = 1
    policy_version: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 1024:
            raise WireError("bad_value", f"Credit.count {self.count}")


@dataclass(frozen=True)
class Directive:
    """An order from the coordinator. ``stop``: finish warmly (the run is done or cancelled)."""

    kind: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in DIRECTIVE_KINDS:
            raise WireError("bad_value", f"unknown directive {self.kind!r}")


DIRECTIVE_KINDS = frozenset({"stop"})


@dataclass(frozen=True)
class Decision:
    """A PBT decision as the coordinator logged it: the target takes the source's weights and
    optimizer state (source == target: it keeps its own) and these hyperparameters. Ids run 1, 2,
    ... and decisions apply in that order, each exactly once."""

    id: int
    target: int
    source: int
    hyperparams: dict[str, float]
    param_noise: float = 0.0  # std of Gaussian noise added to the copied weights

    def __post_init__(self) -> None:
        _counts(self, "target", "source")
        _require(1 <= self.id <= MAX_COUNT, f"Decision.id {self.id} outside [1, 2^40]")
        _require(bool(self.hyperparams) and set(self.hyperparams) <= ALL_TUNABLE,
                 f"Decision.hyperparams must name tunables: {', '.join(sorted(ALL_TUNABLE))}")  # fmt: skip
        _require(self.param_noise >= 0, "Decision.param_noise is negative")
        _require(not hyperparam_problems(self.hyperparams), f"Decision: {hyperparam_problems(self.hyperparams)}")


# PUB topics. ZeroMQ matches topic prefixes, so each ends in a dot: "w1." must not match "w10.".
DIRECTIVE_TOPIC = b"ctl."
DECISION_TOPIC = b"pbt."


def weights_topic(member: int) -> bytes:
    return f"w{member}.".encode()


Message = (Hello | Assign | Weights | Rollout | Credit | ActorReport | LearnerReport | LearnerHeartbeat | Directive
           | Decision)  # fmt: skip
MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (Hello, Assign, Weights, Rollout, Credit, ActorReport, LearnerReport, LearnerHeartbeat, Directive,
                Decision)  # fmt: skip
}


# --- encoding -------------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """One frame for one message."""
    kind = type(message).__name__
    if kind not in MESSAGE_TYPES:
        raise TypeError(f"not an rlmq message: {type(message)!r}")
    fields = _pack(message)
    if isinstance(message, Rollout) and message.frame_stack > 1:
        rows, keys = stack_rows(message.obs, message.frame_stack)
        fields["obs"], fields["frame_keys"] = _pack(rows), _pack(keys.astype(np.int32))
    return msgpack.packb([PROTOCOL_VERSION, kind, fields], use_bin_type=True)


def _pack(value: Any) -> Any:
    kind: type = type(value)
    if kind in _PLAIN:  # most fields: checked first, as encoding a rollout is on an actor's hot path
        return value
    if isinstance(value, np.ndarray):
        # Native byte order, as decode reads it (a copy only where the array is not so already).
        # The shape is the value's own: ascontiguousarray turns a 0-d array into shape (1,).
        # Flattened: memoryview.cast refuses a 0 in the shape.
        array = value
        if not (value.flags.c_contiguous and value.dtype.isnative):
            array = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
        data = memoryview(array.reshape(-1)).cast("B")  # type: ignore[arg-type]
        return [_dtype_name(array.dtype), list(value.shape), data]
    if dataclasses.is_dataclass(value):
        return {name: _pack(getattr(value, name)) for name in _field_names(kind)}
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_pack(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


_PLAIN = frozenset({int, float, str, bool, bytes, type(None)})


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# --- decoding -------------------------------------------------------------------------------


def decode(frame: bytes | memoryview) -> Message:
    """Parse and validate one frame; raises `WireError` for anything that is not a valid message."""
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError("too_large", f"{len(frame)} bytes > {MAX_FRAME_BYTES}")
    try:
        top = msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=MAX_STR_CHARS * 4,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=max(MAX_SEQUENCE, 64),
            max_map_len=MAX_SEQUENCE,
        )
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise WireError("garbage", f"not msgpack ({type(exc).__name__})") from exc
    if not isinstance(top, list) or len(top) != 3:
        raise WireError("garbage", "a frame is [version, kind, fields]")
    version, kind, fields = top
    if type(version) is not int or version != PROTOCOL_VERSION:  # True == 1 == 1.0 in Python
        raise WireError("version", f"protocol {version!r}, this build speaks {PROTOCOL_VERSION}")
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise WireError("unknown_kind", f"{kind!r}")
    given = _unstacked_obs(fields) if kind == "Rollout" and isinstance(fields, dict) and "frame_keys" in fields else {}
    message: Message = _unpack_dataclass(MESSAGE_TYPES[kind], fields, kind, given)
    return message


def _unstacked_obs(fields: dict[str, Any]) -> dict[str, np.ndarray]:
    """A rollout's observations rebuilt from the frame rows and keys it was sent as (`encode`),
    each key checked to name whole stacks of rows there, and no more bytes than one frame may hold."""
    depth, raw_keys = fields.get("frame_stack"), fields.pop("frame_keys")
    if type(depth) is not int or not 1 < depth <= MAX_SEQUENCE:
        raise WireError("bad_value", f"Rollout.frame_stack must be an int > 1 with frame_keys, got {depth!r}")
    rows = _unpack_array(fields.pop("obs", None), "Rollout.obs")
    keys = _unpack_array(raw_keys, "Rollout.frame_keys")
    if keys.dtype.kind != "i" or keys.ndim != 2 or rows.ndim < 1 or rows.ndim + 2 > MAX_ARRAY_DIMS:
        raise WireError("bad_shape", f"Rollout.frame_keys {keys.dtype}{list(keys.shape)} or rows {list(rows.shape)}")
    if keys.size and not (keys.min() >= depth - 1 and keys.max() < len(rows)):
        raise WireError("bad_value", f"Rollout.frame_keys must lie in [{depth - 1}, {len(rows)})")
    if keys.size * depth * rows[:1].nbytes > MAX_FRAME_BYTES:  # what the stacks would have taken
        raise WireError("too_large", f"Rollout.obs rebuilt would exceed {MAX_FRAME_BYTES} bytes")
    return {"obs": unstack_rows(rows, keys, depth)}


def _unpack_dataclass(cls: type, raw: Any, where: str, given: dict[str, Any] | None = None) -> Any:
    """`cls` from the map `raw`, each field unpacked by its type hint; fields in `given` come
    already decoded."""
    if not isinstance(raw, dict):
        raise WireError("bad_type", f"{where} must be a map")
    fields, names = _decoding_plan(cls)
    if not names.issuperset(raw):
        raise WireError("unknown_field", f"{where}: {sorted(set(raw) - names, key=repr)}")  # str and bytes
    values = dict(given or {})
    for name, hint, required in fields:
        if name in values:
            continue
        if name in raw:
            values[name] = _unpack(hint, raw[name], f"{where}.{name}")
        elif required:
            raise WireError("missing_field", f"{where}.{name}")
    try:
        return cls(**values)
    except WireError:
        raise
    except (TypeError, ValueError) as exc:
        raise WireError("bad_value", f"{where}: {exc}") from exc


@functools.cache
def _decoding_plan(cls: type) -> tuple[tuple[tuple[str, Any, bool], ...], frozenset[str]]:
    """A dataclass's fields as decode walks them: (name, type hint, required), and all names."""
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )
    return fields, frozenset(hints)


def _unpack(hint: Any, raw: Any, where: str) -> Any:
    if hint in _SCALARS:
        return _unpack_scalar(hint, raw, where)
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if raw is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _unpack(inner, raw, where)
    if hint is np.ndarray:
        return _unpack_array(raw, where)
    if dataclasses.is_dataclass(hint):
        return _unpack_dataclass(hint, raw, where)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(raw, list) or len(raw) > MAX_SEQUENCE:
            raise WireError("bad_type", f"{where} must be a list")
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(_unpack(item, v, f"{where}[]") for v in raw)
    if origin is dict:
        if not isinstance(raw, dict):
            raise WireError("bad_type", f"{where} must be a map")
        _, value_hint = typing.get_args(hint)
        return {_unpack(str, k, where): _unpack(value_hint, v, f"{where}.{k}") for k, v in raw.items()}
    return _unpack_scalar(hint, raw, where)


_SCALARS = frozenset({bool, int, float, str})


def _unpack_scalar(hint: Any, raw: Any, where: str) -> Any:
    if hint is bool:
        if not isinstance(raw, bool):
            raise WireError("bad_type", f"{where} must be a bool")
        return raw
    if hint is int:
        if not isinstance(raw, int) or isinstance(raw, bool) or not INT64_RANGE[0] <= raw <= INT64_RANGE[1]:
            raise WireError("bad_type", f"{where} must be an int64")
        return raw
    if hint is float:
        if not isinstance(raw, (int, float)) or isinstance(raw, bool):
            raise WireError("bad_type", f"{where} must be a number")
        if not math.isfinite(raw):
            raise WireError("non_finite", where)
        return float(raw)
    if hint is str:
        if not isinstance(raw, str) or len(raw) > MAX_STR_CHARS:
            raise WireError("bad_type", f"{where} must be a string of at most {MAX_STR_CHARS}")
        return raw
    raise TypeError(f"wire cannot carry {hint!r} ({where})")  # a bug in a declaration, not input


def _unpack_array(raw: Any, where: str) -> np.ndarray:
    if not (isinstance(raw, list) and len(raw) == 3):
        raise WireError("bad_type", f"{where} must be [dtype, shape, bytes]")
    dtype_name, shape, data = raw
    if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:  # a list is unhashable
        raise WireError("bad_dtype", f"{where}: {dtype_name!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_ARRAY_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape)
    ):
        raise WireError("bad_shape", f"{where}: {shape!r}")
    if not isinstance(data, bytes):
        raise WireError("bad_type", f"{where}: data must be bytes")
    dtype = np.dtype(dtype_name)
    if math.prod(shape) * dtype.itemsize != len(data):
        raise WireError("bad_shape", f"{where}: shape {shape} × {dtype.itemsize} B ≠ {len(data)} B")
    try:  # a size-0 array can still name dims numpy refuses, e.g. [0, 2**63]
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:
        raise WireError("bad_shape", f"{where}: {shape!r} ({exc})") from exc
    if dtype.kind == "f" and not np.isfinite(array).all():
        raise WireError("non_finite", where)
    if dtype == np.bool_ and array.view(np.uint8).max(initial=0) > 1:
        raise WireError("bad_value", f"{where}: bool bytes must be 0 or 1")
    return array
