"""The wire protocol: every message round-trips, and every malformed message is one `WireError`."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec

TUNABLE = ALGORITHMS["ppo"].tunable

# --- valid messages -------------------------------------------------------------------------

_rng = np.random.default_rng(0)
T, N, OBS = 5, 3, 4

WEIGHTS = wire.Weights(
    member=2,
    version=17,
    params={
        "policy.0.weight": _rng.standard_normal((8, OBS)).astype(np.float32),
        "policy.0.bias": np.zeros(8, np.float32),
        "log_std": np.array([-0.5, 0.25], np.float32),
    },
    final=True,
)
RUN_CONFIG = RunConfig(
    env_id="Pendulum-v1",
    num_envs=3,
    rollout_length=7,
    total_steps=12_345,
    target_return=-200.5,
    seed=9,
    hidden_sizes=(32, 16, 8),
    rollouts_in_flight=4,
    ppo=PPOConfig(learning_rate=3e-4, anneal_steps=5000, epochs=2, rollouts_per_batch=2),
)
ENV_SPEC = EnvSpec(
    obs_shape=(3,),
    action_kind="continuous",
    action_dim=2,
    action_low=(-2.0, -1.0),
    action_high=(2.0, 1.0),
)
ROLLOUT = wire.Rollout(
    member=1,
    policy_version=4,
    actor="actor-3",
    obs=_rng.standard_normal((T + 1, N, OBS)).astype(np.float32),
    actions=_rng.integers(0, 2, (T, N)).astype(np.int64),
    logprobs=-_rng.random((T, N)).astype(np.float32),
    rewards=_rng.standard_normal((T, N)).astype(np.float32),
    terminated=_rng.random((T, N)) < 0.3,
    truncated=_rng.random((T, N)) < 0.3,
    valid=_rng.random((T, N)) < 0.8,
)

MESSAGES: list[tuple[str, Any]] = [
    ("hello-actor", wire.Hello(role="actor", name="actor-0", pid=1234)),
    (
        "hello-learner",
        wire.Hello(
            role="learner",
            name="learner-1",
            pid=99,
            rank=1,
            experience_endpoint="tcp://10.0.0.2:6000",
            metrics_port=9100,
        ),
    ),
    (
        "assign-no-weights",
        wire.Assign(
            run="run-a",
            member=0,
            actor_index=3,
            config=RunConfig(),
            env_spec=EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2),
            learner_endpoints=("tcp://a:1", "tcp://b:2"),
        ),
    ),
    (
        "assign-with-weights",
        wire.Assign(
            run="run-b",
            member=2,
            actor_index=0,
            config=RUN_CONFIG,
            env_spec=ENV_SPEC,
            learner_endpoints=(),
            weights=WEIGHTS,
        ),
    ),
    ("weights", WEIGHTS),
    (
        "weights-odd-shapes",
        wire.Weights(
            member=0,
            version=0,
            params={
                "scalar": np.array(3.5),  # 0-d float64
                "empty": np.zeros((0, 3), np.float32),  # a 0 in the shape
                "strided": np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2],  # not contiguous
                "mask": np.array([[True, False], [False, True]]),
                "pixels": np.arange(6, dtype=np.uint8).reshape(1, 2, 3),
            },
        ),
    ),
    ("rollout", ROLLOUT),
    (
        "rollout-continuous",
        dataclasses.replace(ROLLOUT, actions=_rng.standard_normal((T, N, 2)).astype(np.float32), member=0),
    ),
    ("credit", wire.Credit(count=3)),
    ("actor-report-default", wire.ActorReport(name="actor-0", member=0, env_steps=0)),
    (
        "actor-report",
        wire.ActorReport(
            name="actor-1",
            member=1,
            env_steps=2048,
            episode_returns=np.array([1.5, -2.0, 500.0]),
            episode_lengths=np.array([10, 20, 500], np.int64),
            policy_version=7,
            rejected=2,
            session=2**40,
            steps_total=10_000,
            episodes_total=31,
            episode_lineages=np.array([0, 3, 3], np.int64),
        ),
    ),
    (
        "learner-report",
        wire.LearnerReport(
            name="learner-0",
            rank=0,
            policy_version=12,
            updates=12,
            samples=6144,
            stale_dropped=1,
            mean_policy_lag=1.25,
            rejected=0,
            nonfinite_skipped=3,
        ),
    ),
    ("learner-heartbeat", wire.LearnerHeartbeat(name="learner-1", rank=1, iteration=40, waiting_s=0.5)),
    ("report-ack", wire.ReportAck(steps_total=4096, episodes_total=12, episodes_uncounted=3)),
    ("directive", wire.Directive(kind="stop", reason="target reached")),
    ("decision", wire.Decision(id=3, target=1, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.5), param_noise=0.01)),
    (
        "generation",
        wire.Generation(
            id=4,
            actors=tuple(
                {"policy.0.weight": np.full((2, 3), m, np.float32), "policy.0.bias": np.zeros(2, np.float32)}
                for m in range(3)
            ),
            trained=(True, True, False),
        ),
    ),
    ("diversity-weight", wire.DiversityWeight(id=5, weight=0.5)),
    ("hello-actor-to-learner", wire.Hello(role="actor", name="actor-3", pid=5, member=2)),
    (
        "evaluation-request",
        wire.EvaluationRequest(
            id=7, config=RunConfig(), env_spec=ENV_SPEC, weights=WEIGHTS, episodes=10, deterministic=True, seed=2**30
        ),
    ),
    (
        "evaluation-result",
        wire.EvaluationResult(id=7, returns=np.array([500.0, 9.5]), lengths=np.array([500, 10]), seconds=0.04),
    ),
    ("evaluation-failed", wire.EvaluationResult(id=8, error="ValueError: the env raised")),
    (
        "assign-learner-population",
        wire.Assign(
            run="run-c",
            member=0,
            actor_index=-1,
            config=RunConfig(population=2),
            env_spec=ENV_SPEC,
            learner_endpoints=(),
            hyperparams=(dict.fromkeys(TUNABLE, 0.1), dict.fromkeys(TUNABLE, 0.2)),
            member_weights=(dataclasses.replace(WEIGHTS, member=1),),
            applied_decision=4,
        ),
    ),
]
DECISION = dict(MESSAGES)["decision"]
GENERATION = dict(MESSAGES)["generation"]


def assert_same(a: Any, b: Any, where: str = "message") -> None:
    """Deep equality where arrays must match in dtype, shape and content."""
    assert type(a) is type(b), where
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        assert a.shape == b.shape, where
        assert np.array_equal(a, b), where
    elif isinstance(a, (RunConfig, EnvSpec)):
        assert a == b, where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_messages_cover_every_kind() -> None:
    assert {type(m).__name__ for _, m in MESSAGES} == set(wire.MESSAGE_TYPES)


@pytest.mark.parametrize("message", [m for _, m in MESSAGES], ids=[i for i, _ in MESSAGES])
def test_round_trip(message: Any) -> None:
    encoded = wire.encode(message)
    assert isinstance(encoded, bytes)
    decoded = wire.decode(encoded)
    assert_same(message, decoded)
    assert_same(message, wire.decode(memoryview(encoded)))  # what transport hands over
    assert wire.encode(decoded) == encoded


def test_round_trip_converts_non_native_byte_order() -> None:
    returns = np.array([1.5, -2.0, 3.25], dtype=">f8")  # dtype.name is "float64" either way
    lengths = np.array([1, 2, 3], dtype=">i8")
    decoded = wire.decode(wire.encode(wire.ActorReport("a", 0, 1, episode_returns=returns, episode_lengths=lengths)))
    assert decoded.episode_returns.tolist() == [1.5, -2.0, 3.25]
    assert decoded.episode_lengths.tolist() == [1, 2, 3]


def test_round_trip_of_views_that_are_not_contiguous() -> None:
    """Arrays that are not C-contiguous (transposed, strided, reversed views) arrive with their own
    shape and values: encode lays them out in C order first."""
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    for returns in (base.T[2], base[1, ::2], base[::2, 1]):
        lengths = np.arange(len(returns), dtype=np.int64)[::-1]
        assert not returns.flags.c_contiguous and not lengths.flags.c_contiguous
        decoded = wire.decode(
            wire.encode(wire.ActorReport("a", 0, 1, episode_returns=returns, episode_lengths=lengths))
        )
        assert decoded.episode_returns.tolist() == returns.tolist()
        assert decoded.episode_lengths.tolist() == lengths.tolist()
    obs = np.arange(3 * 2 * 4, dtype=np.float32).reshape(4, 2, 3).transpose(2, 1, 0)  # [T + 1 = 3, N = 2, 4]
    flags = np.zeros((2, 2), bool)
    rollout = wire.Rollout(
        0,
        0,
        "a",
        obs,
        np.zeros((2, 2), np.int64),
        np.zeros((2, 2), np.float32),
        np.ones((2, 2), np.float32),
        flags,
        flags,
        ~flags,
    )
    assert not obs.flags.c_contiguous
    np.testing.assert_array_equal(wire.decode(wire.encode(rollout)).obs, obs)


def test_encode_refuses_a_non_message() -> None:
    with pytest.raises(TypeError):
        wire.encode(RunConfig())  # type: ignore[arg-type]


# --- malformed messages ---------------------------------------------------------------------


def fields_of(message: Any) -> dict[str, Any]:
    """The raw field map of a valid message, to be spoilt by a test."""
    top = msgpack.unpackb(wire.encode(message), raw=False)
    return top[2]


def pack(kind: Any, fields: Any, version: Any = wire.PROTOCOL_VERSION) -> bytes:
    return msgpack.packb([version, kind, fields], use_bin_type=True)


def with_field(message: Any, **changes: Any) -> bytes:
    fields = fields_of(message)
    fields.update(changes)
    return pack(type(message).__name__, fields)


def without_field(message: Any, name: str) -> bytes:
    fields = fields_of(message)
    del fields[name]
    return pack(type(message).__name__, fields)


def array(dtype: Any, shape: Any, data: Any) -> list[Any]:
    return [dtype, shape, data]


HELLO = wire.Hello(role="actor", name="actor-0", pid=1234)
REPORT = wire.ActorReport(name="actor-0", member=0, env_steps=5)
LEARNER_REPORT = dict(MESSAGES)["learner-report"]
ASSIGN = dict(MESSAGES)["assign-with-weights"]
F32_3 = np.arange(3, dtype=np.float32).tobytes()


def rollout_with(**arrays: np.ndarray) -> bytes:
    fields = fields_of(ROLLOUT)
    for name, value in arrays.items():
        fields[name] = array(value.dtype.name, list(value.shape), value.tobytes())
    return pack("Rollout", fields)


def assign_config_with(**changes: Any) -> bytes:
    fields = fields_of(ASSIGN)
    fields["config"].update(changes)
    return pack("Assign", fields)


MALFORMED: list[tuple[str, bytes, str]] = [
    # not a message at all
    ("empty", b"", "garbage"),
    ("never-used-byte", b"\xc1", "garbage"),
    ("random-bytes", np.random.default_rng(1).bytes(200), "garbage"),
    ("trailing-bytes", wire.encode(HELLO) + b"\x00", "garbage"),
    ("not-a-list", msgpack.packb({"kind": "Hello"}), "garbage"),
    ("two-items", msgpack.packb([1, "Credit"]), "garbage"),
    ("four-items", msgpack.packb([1, "Credit", {"count": 1}, 0]), "garbage"),
    ("deep-nesting", b"\x91" * 100_000 + b"\x90", "garbage"),
    # envelope
    ("version-0", pack("Credit", {"count": 1}, version=0), "version"),
    ("version-2", pack("Credit", {"count": 1}, version=2), "version"),
    ("version-str", pack("Credit", {"count": 1}, version="1"), "version"),
    ("version-true", pack("Credit", {"count": 1}, version=True), "version"),
    ("version-float", pack("Credit", {"count": 1}, version=1.0), "version"),
    ("version-nil", pack("Credit", {"count": 1}, version=None), "version"),
    ("kind-unknown", pack("Nope", {}), "unknown_kind"),
    ("kind-lowercase", pack("credit", {"count": 1}), "unknown_kind"),
    ("kind-int", pack(3, {"count": 1}), "unknown_kind"),
    ("kind-list", pack(["Credit"], {"count": 1}), "unknown_kind"),
    ("fields-list", pack("Credit", [1]), "bad_type"),
    ("fields-nil", pack("Credit", None), "bad_type"),
    # fields
    ("unknown-field", with_field(HELLO, shoe_size=43), "unknown_field"),
    ("unknown-bytes-key", pack("Credit", {b"count": 1}), "unknown_field"),
    ("unknown-mixed-keys", pack("Credit", {b"count": 1, "extra": 2}), "unknown_field"),
    ("int-map-key", b"\x93\x01\xa6Credit\x81\x01\x01", "garbage"),  # strict_map_key
    ("missing-pid", without_field(HELLO, "pid"), "missing_field"),
    ("missing-role", without_field(HELLO, "role"), "missing_field"),
    ("missing-obs", without_field(ROLLOUT, "obs"), "missing_field"),
    ("missing-nested", pack("Assign", {**fields_of(ASSIGN), "env_spec": {"obs_shape": [4]}}), "missing_field"),
    ("str-for-int", with_field(HELLO, pid="1234"), "bad_type"),
    ("bool-for-int", with_field(HELLO, pid=True), "bad_type"),
    ("float-for-int", with_field(HELLO, pid=3.0), "bad_type"),
    ("int-above-int64", with_field(HELLO, pid=2**64 - 1), "bad_type"),
    ("nil-for-int", with_field(HELLO, rank=None), "bad_type"),
    ("int-for-str", with_field(HELLO, name=5), "bad_type"),
    ("bytes-for-str", with_field(HELLO, name=b"actor-0"), "bad_type"),
    ("overlong-str", with_field(HELLO, name="x" * (wire.MAX_STR_CHARS + 1)), "bad_type"),
    ("int-for-bool", with_field(WEIGHTS, final=1), "bad_type"),
    ("str-for-float", with_field(LEARNER_REPORT, mean_policy_lag="1.0"), "bad_type"),
    ("bool-for-float", with_field(LEARNER_REPORT, mean_policy_lag=False), "bad_type"),
    ("nan-float", with_field(LEARNER_REPORT, mean_policy_lag=math.nan), "non_finite"),
    ("inf-float", with_field(LEARNER_REPORT, mean_policy_lag=math.inf), "non_finite"),
    ("minus-inf-float", with_field(LEARNER_REPORT, mean_policy_lag=-math.inf), "non_finite"),
    ("ext-type", with_field(HELLO, pid=msgpack.ExtType(5, b"x")), "bad_type"),
    ("str-for-tuple", with_field(ASSIGN, learner_endpoints="tcp://a:1"), "bad_type"),
    ("int-in-tuple", with_field(ASSIGN, learner_endpoints=["tcp://a:1", 2]), "bad_type"),
    ("list-for-nested", with_field(ASSIGN, config=[]), "bad_type"),
    (
        "nan-in-nested-tuple",
        pack("Assign", {**fields_of(ASSIGN), "env_spec": {**fields_of(ASSIGN)["env_spec"], "action_low": [math.nan]}}),
        "non_finite",
    ),
    ("unknown-nested-field", assign_config_with(colour="red"), "unknown_field"),
    ("nested-str-for-int", assign_config_with(num_envs="16"), "bad_type"),
    ("decision-id-0", with_field(DECISION, id=0), "bad_value"),
    (
        "decision-unknown-hyperparam",
        with_field(DECISION, hyperparams={**DECISION.hyperparams, "shoe_size": 43.0}),
        "bad_value",
    ),
    ("decision-no-hyperparams", with_field(DECISION, hyperparams={}), "bad_value"),
    (
        "decision-negative-hyperparam",
        with_field(DECISION, hyperparams={**DECISION.hyperparams, "gamma": -1.0}),
        "bad_value",
    ),
    (
        "decision-nan-hyperparam",
        with_field(DECISION, hyperparams={**DECISION.hyperparams, "gamma": math.nan}),
        "non_finite",
    ),
    ("generation-id-0", with_field(GENERATION, id=0), "bad_value"),
    ("diversity-weight-negative", pack("DiversityWeight", {"id": 1, "weight": -0.5}), "bad_value"),
    ("diversity-weight-id-0", pack("DiversityWeight", {"id": 0, "weight": 0.5}), "bad_value"),
    (
        "generation-one-member",
        with_field(GENERATION, actors=fields_of(GENERATION)["actors"][:1], trained=[True]),
        "bad_value",
    ),
    ("generation-flags-short", with_field(GENERATION, trained=[True, False]), "bad_value"),
    (
        "generation-actors-differ",
        with_field(
            GENERATION, actors=[*fields_of(GENERATION)["actors"][:2], {"policy.0.weight": array("float32", [3], F32_3)}]
        ),
        "bad_value",
    ),
    (
        "report-lineages-short",
        with_field(
            dict(MESSAGES)["actor-report"], episode_lineages=array("int64", [1], np.zeros(1, np.int64).tobytes())
        ),
        "bad_value",
    ),
    (
        "report-lineage-negative",
        with_field(
            dict(MESSAGES)["actor-report"], episode_lineages=array("int64", [3], np.full(3, -1, np.int64).tobytes())
        ),
        "bad_value",
    ),
    ("assign-hyperparams-count", with_field(ASSIGN, hyperparams=[dict.fromkeys(TUNABLE, 0.1)] * 2), "bad_value"),
    ("hello-member-below", with_field(HELLO, member=-2), "bad_value"),
    ("params-list", with_field(WEIGHTS, params=[1, 2]), "bad_type"),
    ("params-bytes-key", with_field(WEIGHTS, params={b"w": array("float32", [3], F32_3)}), "bad_type"),
    # values the message itself refuses
    ("bad-role", with_field(HELLO, role="robot"), "bad_value"),
    ("credit-zero", pack("Credit", {"count": 0}), "bad_value"),
    ("credit-huge", pack("Credit", {"count": 5000}), "bad_value"),
    ("directive-unknown", pack("Directive", {"kind": "dance"}), "bad_value"),
    ("nested-post-init", assign_config_with(num_envs=0), "bad_value"),
    ("nested-bad-algo", assign_config_with(algo="a2c"), "bad_value"),
    # arrays
    ("array-not-list", with_field(REPORT, episode_returns=b"\x00" * 8), "bad_type"),
    ("array-two-items", with_field(REPORT, episode_returns=["float64", [1]]), "bad_type"),
    ("dtype-object", with_field(REPORT, episode_returns=array("object", [1], b"\x00" * 8)), "bad_dtype"),
    ("dtype-complex", with_field(REPORT, episode_returns=array("complex128", [1], b"\x00" * 16)), "bad_dtype"),
    ("dtype-unicode", with_field(REPORT, episode_returns=array("<U3", [1], b"\x00" * 12)), "bad_dtype"),
    ("dtype-float16", with_field(REPORT, episode_returns=array("float16", [1], b"\x00" * 2)), "bad_dtype"),
    ("dtype-void", with_field(REPORT, episode_returns=array("V8", [1], b"\x00" * 8)), "bad_dtype"),
    ("dtype-nil", with_field(REPORT, episode_returns=array(None, [1], b"\x00" * 8)), "bad_dtype"),
    ("dtype-list", with_field(REPORT, episode_returns=array(["float64"], [1], b"\x00" * 8)), "bad_dtype"),
    ("dtype-map", with_field(REPORT, episode_returns=array({"a": 1}, [1], b"\x00" * 8)), "bad_dtype"),
    ("length-short", with_field(REPORT, episode_returns=array("float32", [4], F32_3)), "bad_shape"),
    ("length-long", with_field(REPORT, episode_returns=array("float32", [2], F32_3)), "bad_shape"),
    ("length-itemsize", with_field(REPORT, episode_returns=array("float64", [3], F32_3)), "bad_shape"),
    ("negative-dim", with_field(REPORT, episode_returns=array("float32", [-3], F32_3)), "bad_shape"),
    ("negative-dims-cancel", with_field(REPORT, episode_returns=array("float32", [-1, -3], F32_3)), "bad_shape"),
    (
        "too-many-dims",
        with_field(REPORT, episode_returns=array("float32", [3] + [1] * wire.MAX_ARRAY_DIMS, F32_3)),
        "bad_shape",
    ),
    ("float-dim", with_field(REPORT, episode_returns=array("float32", [3.0], F32_3)), "bad_shape"),
    ("bool-dim", with_field(REPORT, episode_returns=array("float32", [True, 3], F32_3)), "bad_shape"),
    ("shape-int", with_field(REPORT, episode_returns=array("float32", 3, F32_3)), "bad_shape"),
    ("huge-dims-size-zero", with_field(REPORT, episode_returns=array("float32", [0, 2**63], b"")), "bad_shape"),
    ("huge-dims-overflow", with_field(REPORT, episode_returns=array("float32", [0, 2**62, 2**62], b"")), "bad_shape"),
    ("data-str", with_field(REPORT, episode_returns=array("uint8", [3], "abc")), "bad_type"),
    (
        "nan-float32",
        with_field(REPORT, episode_returns=array("float32", [2], np.array([1, np.nan], np.float32).tobytes())),
        "non_finite",
    ),
    (
        "inf-float64",
        with_field(REPORT, episode_returns=array("float64", [2], np.array([np.inf, 1.0]).tobytes())),
        "non_finite",
    ),
    (
        "minus-inf-float64",
        with_field(REPORT, episode_returns=array("float64", [1], np.array([-np.inf]).tobytes())),
        "non_finite",
    ),
    ("bool-byte-2", rollout_with(valid=np.full((T, N), 2, np.uint8).view(np.bool_)), "bad_value"),
    # rollouts whose arrays disagree
    ("rollout-rewards-short", rollout_with(rewards=np.zeros((T - 1, N), np.float32)), "bad_shape"),
    ("rollout-valid-transposed", rollout_with(valid=np.ones((N, T), bool)), "bad_shape"),
    ("rollout-actions-slots", rollout_with(actions=np.zeros((T, N + 1), np.int64)), "bad_shape"),
    ("rollout-obs-1d", rollout_with(obs=np.zeros(T + 1, np.float32)), "bad_shape"),
    (
        "rollout-no-steps",
        rollout_with(
            obs=np.zeros((1, N, OBS), np.float32),
            actions=np.zeros((0, N), np.int64),
            logprobs=np.zeros((0, N), np.float32),
            rewards=np.zeros((0, N), np.float32),
            terminated=np.zeros((0, N), bool),
            truncated=np.zeros((0, N), bool),
            valid=np.zeros((0, N), bool),
        ),
        "bad_shape",
    ),
]


@pytest.mark.parametrize(("encoded", "reason"), [(f, r) for _, f, r in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_a_malformed_message_is_a_wire_error(encoded: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.decode(encoded)
    assert caught.value.reason == reason
    assert str(caught.value).startswith(f"{reason}: ")


def raised_reasons() -> set[str]:
    """The reason of every `WireError(...)` the services raise with a literal one."""
    reasons = set()
    for package in ("common", "actors", "learners", "coordinator", "cli"):
        for path in (Path(__file__).parents[1] / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "WireError"
                ):
                    reasons.add(node.args[0].value)
    return reasons


def test_reasons_are_short_labels() -> None:
    """They become the `reason` label of every service's rejected-messages counter."""
    reasons = raised_reasons() | {r for _, _, r in MALFORMED}
    assert {"garbage", "bad_value", "no_credit", "unknown_member", "stale_weights"} <= reasons
    for reason in reasons:
        assert isinstance(reason, str) and reason.isidentifier() and reason.islower() and len(reason) <= 20, reason


def test_oversize_frame_is_refused_before_parsing() -> None:
    # A valid message padded past the limit: msgpack would report extra data, but size comes first.
    encoded = wire.encode(HELLO)
    oversize = encoded + b"\x00" * (wire.MAX_MESSAGE_BYTES + 1 - len(encoded))
    with pytest.raises(wire.WireError) as caught:
        wire.decode(oversize)
    assert caught.value.reason == "too_large"


@pytest.mark.parametrize("name", ["hello-learner", "assign-with-weights", "rollout", "actor-report"])
def test_every_truncation_is_a_wire_error(name: str) -> None:
    encoded = wire.encode(dict(MESSAGES)[name])
    cuts = np.arange(len(encoded))
    if len(cuts) > 400:  # every prefix of the short messages; a seeded sample of the long ones
        rng = np.random.default_rng(len(encoded))
        cuts = np.concatenate([cuts[:100], cuts[-100:], rng.choice(cuts[100:-100], 200, replace=False)])
    for cut in cuts:
        with pytest.raises(wire.WireError) as caught:
            wire.decode(encoded[:cut])
        assert caught.value.reason == "garbage", cut


@pytest.mark.parametrize("seed", range(3))
def test_random_mutations_raise_only_wire_errors(seed: int) -> None:
    rng = np.random.default_rng(seed)
    valid = [wire.encode(m) for _, m in MESSAGES]
    reasons: set[str] = set()
    decoded = 0
    for _ in range(150):
        encoded = bytearray(valid[rng.integers(len(valid))])
        for _ in range(rng.integers(1, 4)):
            at = int(rng.integers(len(encoded)))
            edit = rng.integers(4)
            if edit == 0:  # overwrite a byte
                encoded[at] = int(rng.integers(256))
            elif edit == 1:  # flip one bit
                encoded[at] ^= 1 << int(rng.integers(8))
            elif edit == 2:  # drop a byte
                del encoded[at]
            else:  # insert a byte
                encoded.insert(at, int(rng.integers(256)))
        try:
            message = wire.decode(bytes(encoded))
        except wire.WireError as exc:
            reasons.add(exc.reason)
        else:
            assert type(message).__name__ in wire.MESSAGE_TYPES
            decoded += 1
    assert len(reasons) >= 3  # the mutations reach past the msgpack parser
    assert decoded < 150
