"""The rlmq wire protocol: every message, the one `encode`/`decode` pair, the one `WireError`.

A message travels as one msgpack value, ``[PROTOCOL_VERSION, kind, {field: value}]``, in a single
ZeroMQ part ("frame" here means only an image). Arrays travel as ``[dtype, shape, raw bytes]`` (one
part beats multipart at rollouts' sizes, benchmarks/LOG.md §12); a rollout of frame stacks sends
each frame once (common/frames.py) and is whole again once decoded. Decoding is driven by the
dataclass annotations below (`common/codec.py` walks them), so what a field may hold is declared
exactly once; every failure (garbage, truncation, wrong version, unknown kind or field, wrong type,
dtype outside the allow-list, shape × itemsize ≠ length, oversize, NaN/inf) raises `WireError`.
Nothing here ever unpickles.

Topology (who sends what to whom, see docs/architecture.md):

    actor, learner  DEALER → coordinator ROUTER   Hello, ActorReport, LearnerReport, Weights,
                                                  LearnerHeartbeat (a learner's own thread)
    coordinator     ROUTER → actor, learner       Assign, ReportAck (an actor's reports are counted up to ...)
    actor           DEALER → learner ROUTER       Hello (a request for credit, renewed while waiting),
                                                  Rollout (one per credit)
    learner         ROUTER → actor                Credit, each preceded by the Weights it names unless
                                                  this actor was sent them (the actors' only weights
                                                  but for an Assign's)
    coordinator     PUB    → actors, learner 0    Directive ("ctl."), Decision, Generation,
                                                  DiversityWeight ("pbt.", to learner 0)
    coordinator     PAIR  ↔ its evaluator         EvaluationRequest → EvaluationResult (a private
                                                  Unix socket: coordinator/evaluator.py)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from rlmq.common.algorithms import hyperparam_problems, is_member_hyperparam
from rlmq.common.architecture import ACTIVATIONS

# The limits and the error are the codec's; they are named here too, where services look for them.
from rlmq.common.codec import MAX_ARRAY_DIMS as MAX_ARRAY_DIMS
from rlmq.common.codec import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from rlmq.common.codec import MAX_SEQUENCE, dtype_name, pack, unpack_array, unpack_dataclass
from rlmq.common.codec import MAX_STR_CHARS as MAX_STR_CHARS
from rlmq.common.codec import WireError as WireError
from rlmq.common.config import RunConfig
from rlmq.common.frames import stack_rows, unstack_rows
from rlmq.common.schema import ROLLOUT_DTYPES, EnvSpec

PROTOCOL_VERSION = 1
MAX_COUNT = 2**40  # bound on counters in reports: a hostile report must not overflow a sum
MAX_LOSS_TERMS = 64  # a learner report's loss terms and statistics (a few dozen at most)
# An actor waiting for a learner's credit repeats its Hello this often; a learner forgets a request
# not renewed for its TTL (learners/credits.py), so dead and stray identities lose their place.
CREDIT_REQUEST_RENEW_S = 0.25
CREDIT_REQUEST_TTL_S = 1.0
MAX_REPORT_INTERVAL_S = 60.0


def _require(condition: bool, detail: str) -> None:
    if not condition:
        raise WireError("bad_value", detail)


def _counts(message: object, *names: str) -> None:
    for name in names:
        value = getattr(message, name)
        _require(0 <= value <= MAX_COUNT, f"{type(message).__name__}.{name} = {value} outside [0, 2^40]")


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
    # The id of the last PBT decision that copied another member's weights into this one (0: none):
    # an actor whose weights change lineage zeroes its recurrent states (actors/collector.py).
    copied_by: int = 0
    # The member's hidden activation where PBT mutates activations ("": the run config's).
    activation: str = ""

    def __post_init__(self) -> None:
        _require(bool(self.params), "Weights.params is empty")
        _counts(self, "member", "version", "trained_steps", "copied_by")
        _require(
            self.activation in ("", *ACTIVATIONS), f"Weights.activation {self.activation!r} is none of {ACTIVATIONS}"
        )


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
    master_host: str = ""  # where rank 0 registered from: the rendezvous of `--master-addr auto`

    def __post_init__(self) -> None:
        _require(len(self.hyperparams) in (0, self.config.population), "Assign.hyperparams: one per member")
        names = set(self.config.base_hyperparams())
        _require(all(set(h) == names for h in self.hyperparams), "Assign.hyperparams: the run's hyperparameters")
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
    # A recurrent policy's state of each slot at the rollout's first step, [N, S] float32 (after the
    # reset of a slot whose episode starts there: docs/architecture.md, "Recurrent policies"). None
    # for a stateless policy: then the field is not sent at all.
    core_state: np.ndarray | None = None

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
            if dtype_name(getattr(self, name).dtype) not in dtypes:
                raise WireError("bad_dtype", f"Rollout.{name} must be {' or '.join(dtypes)}")
        state = self.core_state
        if state is not None and (state.ndim != 2 or state.shape[0] != slots or state.shape[1] < 1):
            raise WireError("bad_shape", f"Rollout.core_state must be [{slots}, state size], got {list(state.shape)}")
        if state is not None and dtype_name(state.dtype) != "float32":
            raise WireError("bad_dtype", "Rollout.core_state must be float32")

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)


@dataclass(frozen=True)
class ActorReport:
    """An actor's heartbeat: env steps since its last report and the episodes it finished.

    With a `session` (drawn at random by each actor process), it also carries the session's totals
    and every finished episode's return the coordinator has not acknowledged (`ReportAck`), the
    newest last: the coordinator counts what the totals add to what it counted before, so a report
    lost, repeated or overtaken changes nothing, and nothing is counted twice across a
    coordinator's restart. Without one (0), `env_steps` and the returns are counted as they come."""

    name: str
    member: int
    env_steps: int
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    episode_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    policy_version: int = 0
    rejected: int = 0  # malformed messages this actor dropped since its last report
    first_step_at: float = 0.0  # unix time of this actor's first env step; 0 before it
    session: int = 0
    steps_total: int = 0  # env steps of the session so far
    episodes_total: int = 0  # episodes of the session so far: `episode_returns` are the last of them
    # Per episode, the `Weights.copied_by` of the weights it started under: an episode begun before
    # a PBT copy or a CEM generation replaced the member's weights is not evidence of the new ones.
    # Empty: every episode's is 0.
    episode_lineages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        _counts(self, "member", "env_steps", "rejected", "session", "steps_total", "episodes_total")
        _require(
            len(self.episode_returns) <= self.episodes_total or not self.session,
            "ActorReport: more returns than episodes",
        )
        _require(self.policy_version >= -1 and self.first_step_at >= 0, "ActorReport: negative field")
        returns, lengths = self.episode_returns, self.episode_lengths
        _require(returns.ndim == 1 and returns.dtype.name == "float64", "episode_returns must be 1-D float64")
        _require(
            lengths.shape == returns.shape and lengths.dtype.name == "int64",
            "episode_lengths must be int64 and match episode_returns",
        )
        lineages = self.episode_lineages
        _require(
            lineages.dtype.name == "int64" and lineages.shape in ((0,), returns.shape),
            "episode_lineages must be int64 and match episode_returns, or be empty",
        )
        _require(not lineages.size or 0 <= lineages.min() <= lineages.max() <= MAX_COUNT, "episode_lineages range")


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
    # Env steps and episode ends in the rollouts this rank's process took from each actor (by
    # name), as totals of its `session` (drawn at random by the process): a secure run counts no
    # more of an actor's reports than these add up to. Totals, so a lost report is owed nothing.
    session: int = 0
    delivered_steps: dict[str, int] = field(default_factory=dict)
    delivered_episodes: dict[str, int] = field(default_factory=dict)
    final: bool = False  # the rank's last report: it has stopped taking rollouts
    idle_requests: int = 0  # identities holding credit requests they do not use (learners/credits.py)
    # What the rank's metrics hold of its training, for the run's curves (coordinator/curves.py):
    # the last update's loss terms and statistics (finite ones), the rollouts queued, and the
    # update's seconds summed since the last report.
    losses: dict[str, float] = field(default_factory=dict)
    queue_depth: int = 0
    update_s: float = 0.0

    def __post_init__(self) -> None:
        _counts(
            self,
            "rank",
            "policy_version",
            "updates",
            "samples",
            "stale_dropped",
            "rejected",
            "applied_decision",
            "nonfinite_skipped",
            "session",
            "idle_requests",
            "queue_depth",
        )
        _require(self.mean_policy_lag >= 0, "LearnerReport.mean_policy_lag is negative")
        _require(self.update_s >= 0, "LearnerReport.update_s is negative")
        _require(len(self.losses) <= MAX_LOSS_TERMS, f"LearnerReport: more than {MAX_LOSS_TERMS} loss terms")
        _require(
            self.session > 0 or not (self.delivered_steps or self.delivered_episodes),
            "LearnerReport: delivered totals need a session",
        )
        for counts in (self.delivered_steps, self.delivered_episodes):
            _require(
                len(counts) <= MAX_SEQUENCE and all(0 <= n <= MAX_COUNT for n in counts.values()),
                f"LearnerReport: delivered counts must be in [0, 2^40], for at most {MAX_SEQUENCE} actors",
            )


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
class ReportAck:
    """Coordinator → actor: your session's env steps and episodes are taken up to these totals.
    Taken, not necessarily counted yet: a secure run counts them as the learners confirm the
    rollouts (coordinator/store.py), and the returns of the newest `episodes_uncounted` taken are
    to be sent again until they count; the others need not be. An actor that stops sends its last
    report again (for a bounded time) while `steps_uncounted` or `episodes_uncounted` are not 0:
    its last rollouts count once the learners say they took them."""

    steps_total: int
    episodes_total: int
    episodes_uncounted: int = 0
    steps_uncounted: int = 0
    # When to report next, seconds (0: the run's `report_interval_s`): a coordinator with a large
    # fleet stretches it, so that its reports per second stay within its budget.
    report_interval_s: float = 0.0

    def __post_init__(self) -> None:
        _counts(self, "steps_total", "episodes_total", "episodes_uncounted", "steps_uncounted")
        _require(0 <= self.report_interval_s <= MAX_REPORT_INTERVAL_S, "ReportAck.report_interval_s out of range")


@dataclass(frozen=True)
class Credit:
    """Learner → actor: you may send me `count` more rollouts (flow control, learners/credits.py).

    `policy_version` is the learner's version now: the actor collects with those weights, which the
    learner sends just ahead of the credit (once per actor and version).
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
        _require(
            bool(self.hyperparams) and all(is_member_hyperparam(name) for name in self.hyperparams),
            f"Decision.hyperparams must name hyperparameters: {sorted(self.hyperparams)}",
        )
        _require(self.param_noise >= 0, "Decision.param_noise is negative")
        _require(not hyperparam_problems(self.hyperparams), f"Decision: {hyperparam_problems(self.hyperparams)}")


@dataclass(frozen=True)
class Generation:
    """A CEM-RL generation as the coordinator logged it (ids shared with `Decision`): every member's
    actor (and its target) becomes the one drawn for it, its optimizer state starts afresh, and
    only the members `trained` learn from the shared critic until the next generation. A later
    generation replaces all that an earlier one set, so a learner behind may skip to it."""

    id: int
    actors: tuple[Params, ...]  # per member: its actor network's parameters, as `Weights.params`
    trained: tuple[bool, ...]

    def __post_init__(self) -> None:
        _require(1 <= self.id <= MAX_COUNT, f"Generation.id {self.id} outside [1, 2^40]")
        _require(len(self.actors) == len(self.trained) >= 2, "Generation: an actor and a flag per member, 2 or more")
        layout = {name: (a.dtype, a.shape) for name, a in self.actors[0].items()}
        _require(bool(layout), "Generation: an actor without parameters")
        _require(
            all({name: (a.dtype, a.shape) for name, a in actor.items()} == layout for actor in self.actors),
            "Generation: every member's actor must have the same parameters",
        )


@dataclass(frozen=True)
class DiversityWeight:
    """DvD's adaptive weight as the coordinator logged it (ids shared with `Decision`): λ of the
    diversity term for every member from now on. A later one replaces an earlier one."""

    id: int
    weight: float

    def __post_init__(self) -> None:
        _require(1 <= self.id <= MAX_COUNT, f"DiversityWeight.id {self.id} outside [1, 2^40]")
        _require(0 <= self.weight <= MAX_COUNT, "DiversityWeight.weight outside [0, 2^40]")


@dataclass(frozen=True)
class EvaluationRequest:
    """The coordinator asks its evaluator (a child process, over a private socket) to play one
    member's weights for `episodes` episodes, episode i from `seed + i`."""

    id: int
    config: RunConfig
    env_spec: EnvSpec
    weights: Weights
    episodes: int
    deterministic: bool
    seed: int

    def __post_init__(self) -> None:
        _counts(self, "id", "seed")
        _require(1 <= self.episodes <= MAX_SEQUENCE, f"EvaluationRequest.episodes {self.episodes}")


@dataclass(frozen=True)
class EvaluationResult:
    """What the evaluator saw for request `id`: each episode's return and length, or why it could
    not play them (`error`)."""

    id: int
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seconds: float = 0.0
    error: str = ""

    def __post_init__(self) -> None:
        _counts(self, "id")
        _require(self.returns.ndim == 1 and self.returns.dtype.name == "float64", "returns must be 1-D float64")
        _require(
            self.lengths.shape == self.returns.shape and self.lengths.dtype.name == "int64",
            "lengths must be int64 and match returns",
        )
        _require(
            0 <= self.seconds <= MAX_COUNT and (len(self.returns) > 0) != bool(self.error),
            "EvaluationResult: returns or an error, and a time in [0, 2^40]",
        )


# PUB topics. ZeroMQ matches topic prefixes, so each ends in a dot.
DIRECTIVE_TOPIC = b"ctl."
DECISION_TOPIC = b"pbt."


Message = (
    Hello
    | Assign
    | Weights
    | Rollout
    | Credit
    | ActorReport
    | ReportAck
    | LearnerReport
    | LearnerHeartbeat
    | Directive
    | Decision
    | Generation
    | DiversityWeight
    | EvaluationRequest
    | EvaluationResult
)
MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Hello,
        Assign,
        Weights,
        Rollout,
        Credit,
        ActorReport,
        ReportAck,
        LearnerReport,
        LearnerHeartbeat,
        Directive,
        Decision,
        Generation,
        DiversityWeight,
        EvaluationRequest,
        EvaluationResult,
    )
}


# --- encoding -------------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """A message, encoded: the bytes of its one ZeroMQ part."""
    kind = type(message).__name__
    if kind not in MESSAGE_TYPES:
        raise TypeError(f"not an rlmq message: {type(message)!r}")
    fields = pack(message)
    if isinstance(message, Rollout) and message.core_state is None:
        del fields["core_state"]  # a stateless policy's rollouts are what they were before cores
    if isinstance(message, Rollout) and message.frame_stack > 1:
        rows, keys = stack_rows(message.obs, message.frame_stack)
        fields["obs"], fields["frame_keys"] = pack(rows), pack(keys.astype(np.int32))
    return msgpack.packb([PROTOCOL_VERSION, kind, fields], use_bin_type=True)


# --- decoding -------------------------------------------------------------------------------


def decode(encoded: bytes | memoryview) -> Message:
    """Parse and validate one encoded message; raises `WireError` for anything that is not a valid message."""
    if len(encoded) > MAX_MESSAGE_BYTES:
        raise WireError("too_large", f"{len(encoded)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        top = msgpack.unpackb(
            encoded,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=MAX_STR_CHARS * 4,
            max_bin_len=MAX_MESSAGE_BYTES,
            max_array_len=max(MAX_SEQUENCE, 64),
            max_map_len=MAX_SEQUENCE,
        )
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise WireError("garbage", f"not msgpack ({type(exc).__name__})") from exc
    if not isinstance(top, list) or len(top) != 3:
        raise WireError("garbage", "a message is [version, kind, fields]")
    version, kind, fields = top
    if type(version) is not int or version != PROTOCOL_VERSION:  # True == 1 == 1.0 in Python
        raise WireError("version", f"protocol {version!r}, this build speaks {PROTOCOL_VERSION}")
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise WireError("unknown_kind", f"{kind!r}")
    given = _unstacked_obs(fields) if kind == "Rollout" and isinstance(fields, dict) and "frame_keys" in fields else {}
    message: Message = unpack_dataclass(MESSAGE_TYPES[kind], fields, kind, given)
    return message


def _unstacked_obs(fields: dict[str, Any]) -> dict[str, np.ndarray]:
    """A rollout's observations rebuilt from the frame rows and keys it was sent as (`encode`),
    each key checked to name whole stacks of rows there, and no more bytes than one message may hold."""
    depth, raw_keys = fields.get("frame_stack"), fields.pop("frame_keys")
    if type(depth) is not int or not 1 < depth <= MAX_SEQUENCE:
        raise WireError("bad_value", f"Rollout.frame_stack must be an int > 1 with frame_keys, got {depth!r}")
    rows = unpack_array(fields.pop("obs", None), "Rollout.obs")
    keys = unpack_array(raw_keys, "Rollout.frame_keys")
    if keys.dtype.kind != "i" or keys.ndim != 2 or rows.ndim < 1 or rows.ndim + 2 > MAX_ARRAY_DIMS:
        raise WireError("bad_shape", f"Rollout.frame_keys {keys.dtype}{list(keys.shape)} or rows {list(rows.shape)}")
    if keys.size and not (keys.min() >= depth - 1 and keys.max() < len(rows)):
        raise WireError("bad_value", f"Rollout.frame_keys must lie in [{depth - 1}, {len(rows)})")
    if keys.size * depth * rows[:1].nbytes > MAX_MESSAGE_BYTES:  # what the stacks would have taken
        raise WireError("too_large", f"Rollout.obs rebuilt would exceed {MAX_MESSAGE_BYTES} bytes")
    return {"obs": unstack_rows(rows, keys, depth)}
