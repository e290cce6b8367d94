"""Running services keep serving after malformed input: each one is sent garbage over its real
sockets, counts it in `rlmq_rejected_messages_total`, and then still answers a valid message."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from procs import start_coordinator, wait_for, write_run_config

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.common.transport import free_port
from rlmq.coordinator.store import RunStore
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

CARTPOLE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)

BAD_MESSAGES = [
    b"",
    b"\xc1\xc1 definitely not msgpack",
    msgpack.packb([wire.PROTOCOL_VERSION + 1, "Hello", {"role": "actor", "name": "x", "pid": 1}]),
    msgpack.packb([wire.PROTOCOL_VERSION, "Pickle", {}]),
    msgpack.packb([wire.PROTOCOL_VERSION, "Hello", {"role": "actor", "name": 7, "pid": 1}]),
    msgpack.packb(
        [wire.PROTOCOL_VERSION, "Weights", {"member": 0, "version": 1, "params": {"w": ["object", [1], b"\x00" * 8]}}]
    ),
    msgpack.packb(
        [wire.PROTOCOL_VERSION, "Weights", {"member": 0, "version": 1, "params": {"w": ["float32", [3], b"\x00" * 8]}}]
    ),
]


def raw(kind: str, fields: dict[str, Any]) -> bytes:
    """An encoded message that decodes field by field, for contents a dataclass would refuse to build."""
    return msgpack.packb([wire.PROTOCOL_VERSION, kind, fields])


def array(a: np.ndarray) -> list[Any]:
    return [a.dtype.name, list(a.shape), a.tobytes()]


# Well-formed msgpack, wrong meaning: each must be refused by the message's own checks.
SEMANTIC_MESSAGES = [
    raw("ActorReport", {"name": "a", "member": 0, "env_steps": -5}),
    raw("ActorReport", {"name": "a", "member": 0, "env_steps": 2**62}),
    raw("ActorReport", {"name": "a", "member": 0, "env_steps": 1, "episode_returns": array(np.ones((2, 2)))}),
    raw(
        "LearnerReport",
        {
            "name": "l",
            "rank": 0,
            "policy_version": 1,
            "updates": -1,
            "samples": 0,
            "stale_dropped": 0,
            "mean_policy_lag": 0.0,
        },
    ),
    raw(
        "Rollout",
        {
            "member": 0,
            "policy_version": 0,
            "actor": "a",
            **{k: array(np.zeros((8, 0), bool)) for k in ("terminated", "truncated", "valid")},
            "obs": array(np.zeros((9, 0, 4), np.float32)),
            "actions": array(np.zeros((8, 0), np.int64)),
            "logprobs": array(np.zeros((8, 0), np.float32)),
            "rewards": array(np.zeros((8, 0), np.float32)),
        },
    ),
]


def rejected_total(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("rlmq_rejected_messages_total{")
    )


def receive(sock: zmq.Socket, timeout_ms: int = 10_000) -> wire.Message:
    assert sock.poll(timeout_ms, zmq.POLLIN), "no answer"
    return wire.decode(sock.recv_multipart()[-1])


def test_coordinator_survives_garbage(start_service: Any, tmp_path: Path, redis_url: str, run_id: str) -> None:
    coord = start_coordinator(start_service, tmp_path, redis_url, run_id)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{coord['control']}")
    wait_for(lambda: _scrape_ok(coord["metrics"]), 30, "coordinator /metrics")
    for encoded in [*BAD_MESSAGES, *SEMANTIC_MESSAGES]:
        sock.send(encoded)
    sock.send_multipart([b"two", b"parts"])
    expected = len(BAD_MESSAGES) + len(SEMANTIC_MESSAGES) + 1
    wait_for(lambda: rejected_total(coord["metrics"]) >= expected, 10, "rejects counted")
    sock.send(
        wire.encode(wire.Hello(role="learner", name="l0", pid=1, rank=0, experience_endpoint="tcp://127.0.0.1:9"))
    )
    answer = receive(sock)
    assert isinstance(answer, wire.Assign) and answer.env_spec == CARTPOLE

    # Valid messages that a coordinator must still refuse: they would poison every actor.
    params = to_numpy_params(ActorCritic(CARTPOLE, (8,)))
    intruder = zmq.Context.instance().socket(zmq.DEALER)  # not the registered rank 0
    intruder.connect(f"tcp://127.0.0.1:{coord['control']}")
    intruder.send(wire.encode(wire.Weights(member=0, version=99, params=params)))
    sock.send(wire.encode(wire.Weights(member=0, version=1, params={"policy.0.weight": np.ones(3, np.float32)})))
    sock.send(wire.encode(wire.Weights(member=7, version=1, params=params)))
    sock.send(wire.encode(wire.ActorReport(name="a", member=3, env_steps=10)))
    wait_for(lambda: rejected_total(coord["metrics"]) >= expected + 4, 10, "semantic rejects counted")
    store = RunStore.connect(redis_url, run_id)
    assert store.weights(0) is None and store.status().env_steps == 0, "nothing refused was kept"
    sock.send(wire.encode(wire.Weights(member=0, version=1, params=params)))
    wait_for(lambda: store.weights(0) is not None, 10, "rank 0's valid weights stored")

    # An actor whose name ends in a non-ASCII digit still gets its assignment.
    sock.send(wire.encode(wire.Hello(role="actor", name="actor-²", pid=2)))
    answer = receive(sock)
    assert isinstance(answer, wire.Assign) and answer.weights is not None and answer.weights.version == 1
    assert coord["service"].alive()
    sock.close()
    intruder.close()


def _scrape_ok(port: int) -> bool:
    try:
        rejected_total(port)
        return True
    except OSError:
        return False


def test_learner_survives_garbage(start_service: Any, tmp_path: Path, redis_url: str, run_id: str) -> None:
    coord = start_coordinator(start_service, tmp_path, redis_url, run_id)
    learner_metrics = free_port()
    learner = start_service(
        "learner",
        "learner",
        "--run",
        run_id,
        "--coordinator",
        f"tcp://127.0.0.1:{coord['control']}",
        "--broadcast",
        f"tcp://127.0.0.1:{coord['broadcast']}",
        "--master-port",
        str(free_port()),
        "--metrics-port",
        str(learner_metrics),
        "--experience-port",
        "0",
    )
    store = RunStore.connect(redis_url, run_id)
    endpoint = wait_for(lambda: (rank_0 := store.learners().get(0)) and rank_0.endpoint, 60, "learner registration")
    wait_for(lambda: store.weights(0) is not None, 60, "the learner's first weights")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    wrong_obs = _rollout(obs_size=5)
    out_of_range = _rollout(actions=np.full((8, 4), 7, np.int64))  # 2 actions in CartPole
    sock.send(wire.encode(_rollout()))  # no credit held: dropped, or the budget means nothing
    wait_for(lambda: rejected_total(learner_metrics) >= 1, 10, "the uncredited rollout refused")
    sock.send(wire.encode(wire.Hello(role="actor", name="a", pid=1, member=0)))
    first_weights, credit = receive(sock), receive(sock)  # the weights the credit names come just ahead of it
    assert isinstance(first_weights, wire.Weights) and isinstance(credit, wire.Credit)
    assert (first_weights.member, first_weights.version) == (0, credit.policy_version)
    too_long = _rollout(steps=9)  # the run's rollouts are 8 steps
    bad = [
        *BAD_MESSAGES,
        *SEMANTIC_MESSAGES,
        wire.encode(wire.Credit(1)),
        wire.encode(wrong_obs),
        wire.encode(out_of_range),
        wire.encode(too_long),
        wire.encode(dataclasses.replace(_rollout(), member=1)),
        wire.encode(wire.Hello(role="actor", name="b", pid=2, member=1)),  # a population of one
        wire.encode(wire.Hello(role="actor", name="c", pid=3)),
    ]  # no member: not an assigned actor
    for encoded in bad:
        sock.send(encoded)
    wait_for(lambda: rejected_total(learner_metrics) >= 1 + len(bad), 10, "rejects counted")
    sock.send(wire.encode(wire.Hello(role="actor", name="a", pid=1, member=0)))  # the credit was spent
    credit = receive(sock)  # without weights: we were sent this version already
    assert isinstance(credit, wire.Credit) and credit.policy_version == first_weights.version
    sock.send(wire.encode(_rollout()))
    trained, credit = receive(sock), receive(sock)
    assert isinstance(trained, wire.Weights) and isinstance(credit, wire.Credit), (
        "a valid rollout after garbage is accepted"
    )
    assert trained.version == credit.policy_version == first_weights.version + 1  # it trained on it
    assert learner.alive(), learner.log()
    sock.close()


def _rollout(obs_size: int = 4, actions: np.ndarray | None = None, steps: int = 8) -> wire.Rollout:
    slots = 4
    return wire.Rollout(
        member=0,
        policy_version=0,
        actor="a",
        obs=np.zeros((steps + 1, slots, obs_size), np.float32),
        actions=np.zeros((steps, slots), np.int64) if actions is None else actions,
        logprobs=np.full((steps, slots), -0.69, np.float32),
        rewards=np.ones((steps, slots), np.float32),
        terminated=np.zeros((steps, slots), bool),
        truncated=np.zeros((steps, slots), bool),
        valid=np.ones((steps, slots), bool),
    )


@pytest.fixture
def fake_peers() -> Any:
    """A stand-in coordinator (ROUTER + PUB) and learner (ROUTER) for one real actor process."""
    ctx = zmq.Context.instance()
    control, pub, sink = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    ports = [s.bind_to_random_port("tcp://127.0.0.1") for s in (control, pub, sink)]
    yield control, pub, sink, ports
    for s in (control, pub, sink):
        s.close(linger=0)


def test_actor_survives_garbage(start_service: Any, fake_peers: Any) -> None:
    control, pub, sink, (control_port, pub_port, sink_port) = fake_peers
    metrics_port = free_port()
    # Configured the way a container is: by RLMQ_* environment variables, no flags.
    actor = start_service(
        "actor",
        "actor",
        env={
            "RLMQ_NAME": "actor-3",
            "RLMQ_COORDINATOR": f"tcp://127.0.0.1:{control_port}",
            "RLMQ_BROADCAST": f"tcp://127.0.0.1:{pub_port}",
            "RLMQ_METRICS_PORT": str(metrics_port),
        },
    )
    identity, hello = wait_for(lambda: control.poll(100) and control.recv_multipart(), 30, "actor hello")
    assert wire.decode(hello) == wire.Hello(
        role="actor", name="actor-3", pid=actor.process.pid, metrics_port=metrics_port
    )
    params = to_numpy_params(ActorCritic(CARTPOLE, (16,)))
    assign = wire.Assign(
        run="t",
        member=0,
        actor_index=3,
        config=RunConfig(num_envs=4, rollout_length=8),
        env_spec=CARTPOLE,
        learner_endpoints=(f"tcp://127.0.0.1:{sink_port}",),
        weights=wire.Weights(member=0, version=1, params=params),
    )
    control.send_multipart([identity, wire.encode(assign)])

    def next_rollout(*ahead: wire.Weights) -> wire.Rollout:
        while True:
            who, encoded = sink.recv_multipart() if sink.poll(10_000) else (None, None)
            assert who is not None, f"the actor went quiet:\n{actor.log()}"
            for weights in ahead:  # a learner sends weights just ahead of the credit that names them
                sink.send_multipart([who, wire.encode(weights)])
            sink.send_multipart([who, wire.encode(wire.Credit(1))])
            message = wire.decode(encoded)
            if isinstance(message, wire.Rollout):
                return message

    assert next_rollout().policy_version == 1
    topic = wire.DIRECTIVE_TOPIC  # what an actor reads of the broadcast
    for encoded in BAD_MESSAGES:
        pub.send_multipart([topic, encoded])
    pub.send_multipart([topic])  # one part where two belong
    wait_for(lambda: next_rollout() and rejected_total(metrics_port) >= len(BAD_MESSAGES) + 1, 20, "rejects")
    bad_shapes = {k: np.zeros((3, 3), np.float32) for k in params}  # decodes, but fits no policy
    next_rollout(wire.Weights(member=0, version=9, params=bad_shapes))
    assert next_rollout().policy_version == 1, "rejected weights must not be adopted"
    assert rejected_total(metrics_port) >= len(BAD_MESSAGES) + 2
    next_rollout(wire.Weights(member=0, version=7, params=params))
    assert next_rollout().policy_version == 7
    rejected = rejected_total(metrics_port)
    next_rollout(wire.Weights(member=1, version=30, params=params), wire.Weights(member=0, version=12, params=params))
    assert next_rollout().policy_version == 12, "weights that come with a credit are used at once"
    next_rollout(wire.Weights(member=0, version=5, params=params))  # a restarted learner world counts from 5
    assert next_rollout().policy_version == 5, "a learner's own weights are used, newer or not"
    wait_for(lambda: rejected_total(metrics_port) == rejected + 1, 10, "another member's weights refused")
    assert actor.alive(), actor.log()


def test_an_actor_assigned_before_any_weights_takes_those_its_credit_brings_or_asks_again(
    start_service: Any, fake_peers: Any
) -> None:
    """Assigned before any weights exist, the actor asks the learner for credit all the same: the
    weights a credit names come just ahead of it. When those do not fit its policy (refused), it
    holds a credit and nothing to collect with, so it asks the coordinator, whose Assign carries
    the latest weights it holds."""
    control, _pub, sink, (control_port, pub_port, sink_port) = fake_peers
    actor = start_service(
        "actor",
        "actor",
        "--name",
        "actor-1",
        "--coordinator",
        f"tcp://127.0.0.1:{control_port}",
        "--broadcast",
        f"tcp://127.0.0.1:{pub_port}",
        "--metrics-port",
        "-1",
    )
    identity, _hello = wait_for(lambda: control.poll(100) and control.recv_multipart(), 30, "actor hello")
    assign = wire.Assign(
        run="t",
        member=0,
        actor_index=1,
        config=RunConfig(num_envs=4, rollout_length=8),
        env_spec=CARTPOLE,
        learner_endpoints=(f"tcp://127.0.0.1:{sink_port}",),
    )
    control.send_multipart([identity, wire.encode(assign)])  # no weights yet
    who, request = wait_for(lambda: sink.poll(100) and sink.recv_multipart(), 10, "a request for credit")
    assert isinstance(wire.decode(request), wire.Hello)
    params = to_numpy_params(ActorCritic(CARTPOLE, (16,)))
    misfit = wire.Weights(member=0, version=3, params={k: np.zeros((3, 3), np.float32) for k in params})
    sink.send_multipart([who, wire.encode(misfit)])
    sink.send_multipart([who, wire.encode(wire.Credit(1, policy_version=3))])
    _identity, again = wait_for(lambda: control.poll(100) and control.recv_multipart(), 10, "a second hello")
    assert isinstance(wire.decode(again), wire.Hello)
    weights = wire.Weights(member=0, version=4, params=params)
    control.send_multipart([identity, wire.encode(dataclasses.replace(assign, weights=weights))])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the credit held is spent on a rollout collected with version 4
        who, encoded = sink.recv_multipart() if sink.poll(10_000) else (None, None)
        assert who is not None, f"the actor went quiet:\n{actor.log()}"
        message = wire.decode(encoded)
        if isinstance(message, wire.Rollout):
            assert message.policy_version == 4
            break
    else:
        raise AssertionError("no rollout")


def test_a_restarted_coordinator_resumes_from_redis(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    first = start_coordinator(start_service, tmp_path, redis_url, run_id)
    learner = zmq.Context.instance().socket(zmq.DEALER)
    learner.setsockopt(zmq.IDENTITY, b"learner-0-4242")
    learner.connect(f"tcp://127.0.0.1:{first['control']}")
    learner.send(
        wire.encode(
            wire.Hello(role="learner", name="learner-0", pid=4242, rank=0, experience_endpoint="tcp://127.0.0.1:7")
        )
    )
    assert isinstance(receive(learner), wire.Assign)
    params = to_numpy_params(ActorCritic(CARTPOLE, (8,)))
    learner.send(wire.encode(wire.Weights(member=0, version=3, params=params)))
    learner.send(wire.encode(wire.ActorReport(name="actor-1", member=0, env_steps=100)))
    store = RunStore.connect(redis_url, run_id)
    wait_for(lambda: store.weights(0) is not None and store.status().env_steps == 100, 10, "state saved")
    assert first["service"].stop() == 0
    learner.close()

    # Same run, same Redis, new process: it must know the learner and the weights without being told.
    second = start_service(
        "coordinator2",
        "coordinator",
        "--run",
        run_id,
        "--redis-url",
        redis_url,
        "--run-config",
        str(write_run_config(tmp_path, num_envs=99)),  # ignored: Redis holds the config
        "--control-bind",
        f"tcp://127.0.0.1:{first['control']}",
        "--metrics-port",
        "-1",
        "--broadcast-bind",
        f"tcp://127.0.0.1:{first['broadcast']}",
    )
    actor = zmq.Context.instance().socket(zmq.DEALER)
    actor.connect(f"tcp://127.0.0.1:{first['control']}")
    actor.send(wire.encode(wire.Hello(role="actor", name="actor-5", pid=5)))
    # The learner Redis names may be gone: an actor gets its endpoint only once it is heard from.
    assert not actor.poll(4_000, zmq.POLLIN), "an actor was handed the endpoint of a learner not heard from"
    beat = zmq.Context.instance().socket(zmq.DEALER)
    beat.connect(f"tcp://127.0.0.1:{first['control']}")
    beat.send(wire.encode(wire.LearnerHeartbeat(name="learner-0", rank=0, iteration=9, waiting_s=0.0)))
    answer = receive(actor, timeout_ms=30_000)
    assert isinstance(answer, wire.Assign), second.log()
    assert answer.learner_endpoints == ("tcp://127.0.0.1:7",) and answer.actor_index == 5
    assert answer.weights is not None and answer.weights.version == 3
    assert answer.config.num_envs == 4
    # Rank 0 still publishes from the same socket identity: its weights are still accepted.
    learner = zmq.Context.instance().socket(zmq.DEALER)
    learner.setsockopt(zmq.IDENTITY, b"learner-0-4242")
    learner.connect(f"tcp://127.0.0.1:{first['control']}")
    learner.send(wire.encode(wire.Weights(member=0, version=4, params=params)))
    wait_for(lambda: (w := store.weights(0)) is not None and w.version == 4, 10, "weights after restart")
    assert store.status().env_steps == 100
    actor.close()
    learner.close()
    beat.close()


def test_a_pbt_decision_survives_a_crash_between_logging_and_applying(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    """The coordinator dies (a failpoint) right after logging decision 1 to the Redis stream; the
    restarted one applies it, exactly once, and hands it to the learners; a third start finds
    nothing left to apply."""
    # Fitness from the reports (no weights here to evaluate): evaluation.episodes = 0.
    config = {"population": 3, "pbt": {"interval": 100, "fitness_episodes": 2}, "evaluation": {"episodes": 0}}
    ports = {"control": free_port(), "broadcast": free_port(), "metrics": free_port()}
    first = start_coordinator(
        start_service,
        tmp_path,
        redis_url,
        run_id,
        ports=ports,
        name="first",
        env={"RLMQ_FAILPOINT": "pbt-after-append"},
        **config,
    )
    store = RunStore.connect(redis_url, run_id)
    wait_for(lambda: store.members(), 30, "the population in Redis")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{ports['control']}")
    for member, value in enumerate((10.0, 100.0, 50.0)):  # fitness first, then the steps
        sock.send(
            wire.encode(
                wire.ActorReport(
                    name=f"actor-{member}",
                    member=member,
                    env_steps=0,
                    episode_returns=np.full(2, value),
                    episode_lengths=np.full(2, 10, np.int64),
                )
            )
        )
    wait_for(lambda: all(len(store.recent_returns(m)) == 2 for m in range(3)), 10, "the returns")
    for member in range(3):
        sock.send(wire.encode(wire.ActorReport(name=f"actor-{member}", member=member, env_steps=200)))
    assert first["service"].process.wait(30) == 86, first["service"].log()
    (logged,) = store.decisions()
    assert (logged.id, logged.target, logged.source, logged.kind) == (1, 0, 1, "exploit")
    assert store.applied_decision() == 0 and store.members()[0].generation == 0  # logged, not applied

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, wire.DECISION_TOPIC)
    sub.connect(f"tcp://127.0.0.1:{ports['broadcast']}")
    second = start_coordinator(start_service, tmp_path, redis_url, run_id, ports=ports, name="second", **config)
    wait_for(lambda: store.applied_decision() == 1, 30, "the logged decision applied")
    assert sub.poll(10_000), "the decision is handed to the learners"
    sent = wire.decode(sub.recv_multipart()[1])
    assert isinstance(sent, wire.Decision) and (sent.id, sent.target, sent.source) == (1, 0, 1)
    assert sent.hyperparams == logged.hyperparams
    record = store.members()[0]
    assert (record.generation, record.parent, record.hyperparams) == (1, 1, logged.hyperparams)
    assert store.recent_returns(0) == []  # earned by the weights member 0 no longer has
    # Learner rank 0 reports it applied: the coordinator stops repeating it. Only rank 0's own
    # socket is believed, and never beyond what the coordinator applied.
    report = wire.LearnerReport(
        name="learner-0",
        rank=0,
        policy_version=0,
        updates=0,
        samples=0,
        stale_dropped=0,
        mean_policy_lag=0.0,
        applied_decision=10**6,
    )
    sock.send(wire.encode(report))  # not (yet) learner rank 0: ignored
    time.sleep(1.0)
    assert store.status().learner_applied_decision == 0
    sock.send(wire.encode(wire.Hello(role="learner", name="learner-0", pid=1, rank=0, experience_endpoint="tcp://x:1")))
    assert isinstance(receive(sock), wire.Assign)
    sock.send(wire.encode(report))
    wait_for(
        lambda: store.status().learner_applied_decision == store.applied_decision(), 10, "the learner's report, capped"
    )
    assert second["service"].stop() == 0

    # Meanwhile member 2, now the worst judged member, was replaced too (decision 2): fine, as long
    # as every logged decision is applied and each id is logged once.
    logged_ids = [d.id for d in store.decisions()]
    assert logged_ids == list(range(1, len(logged_ids) + 1)) and store.applied_decision() == len(logged_ids)
    third = start_coordinator(start_service, tmp_path, redis_url, run_id, ports=ports, name="third", **config)
    time.sleep(1.5)  # a few ticks: time to (wrongly) apply or decide anything again
    assert third["service"].alive(), third["service"].log()
    assert [d.id for d in store.decisions()] == logged_ids and store.applied_decision() == len(logged_ids)
    assert store.members()[0].generation == 1
    sock.close()
    sub.close()


MMAPPED_BLOCKS_FOR_AN_ACTIVATION = """
import ctypes, sys
from rlmq.common.service import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
before = libc.mallinfo2().hblks
block = libc.malloc(512 * 1024)  # one 8-member activation of a learner step
print(libc.mallinfo2().hblks - before)
"""


def test_a_report_the_coordinator_counted_but_died_before_acknowledging_is_counted_once(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    """The coordinator dies between counting an actor's report and acknowledging it; the actor,
    unacknowledged, sends the report again to the restarted coordinator, which acknowledges it
    without counting it a second time."""
    first = start_coordinator(start_service, tmp_path, redis_url, run_id, env={"RLMQ_FAILPOINT": "report-before-ack"})
    store = RunStore.connect(redis_url, run_id)
    wait_for(lambda: store.status().state == "running", 30, "the run in Redis")
    actor = zmq.Context.instance().socket(zmq.DEALER)
    actor.connect(f"tcp://127.0.0.1:{first['control']}")
    report = wire.ActorReport(
        name="actor-0",
        member=0,
        env_steps=100,
        episode_returns=np.array([9.0]),
        episode_lengths=np.array([9], np.int64),
        session=77,
        steps_total=100,
        episodes_total=1,
    )
    actor.send(wire.encode(report))
    assert first["service"].process.wait(30) == 86, first["service"].log()
    assert store.status().env_steps == 100 and not actor.poll(0, zmq.POLLIN)  # counted, not acknowledged
    start_coordinator(
        start_service,
        tmp_path,
        redis_url,
        run_id,
        name="second",
        ports={k: first[k] for k in ("control", "broadcast", "metrics")},
    )
    actor.send(wire.encode(report))  # unacknowledged: sent again
    assert receive(actor, timeout_ms=30_000) == wire.ReportAck(steps_total=100, episodes_total=1)
    later = dataclasses.replace(
        report, env_steps=5, steps_total=105, episode_returns=np.array([]), episode_lengths=np.array([], np.int64)
    )
    actor.send(wire.encode(later))
    assert receive(actor) == wire.ReportAck(steps_total=105, episodes_total=1)
    status = store.status()
    assert (status.env_steps, status.episodes) == (105, 1), status
    actor.close()


def test_learners_keep_freed_memory_instead_of_faulting_it_in_again() -> None:
    """A learner frees and reallocates the same few-hundred-KB activations every step. glibc serves
    a block above its 128 KB mmap threshold with a fresh mmap, whose pages fault in again each
    time; keep_freed_memory raises the threshold so that the block comes from the heap, which keeps
    its freed pages (the speed it buys: benchmarks/LOG.md §4). Counting page faults per step
    showed the effect, but too noisily on a busy host (glibc's threshold also adapts by itself):
    this checks where a fresh process's first such block comes from. Each mode in its own process:
    the setting is process-wide."""

    def mmapped_blocks(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", MMAPPED_BLOCKS_FOR_AN_ACTIVATION, mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return int(done.stdout)

    assert mmapped_blocks("default") == 1, "glibc's defaults changed: this test's premise no longer holds"
    assert mmapped_blocks("keep") == 0, "with keep_freed_memory a 512 KB block must come from the heap"
