"""CURVE keys and the gatekeeper (common/security.py) over real ZeroMQ sockets: a key on the
allow-list gets in as its role and name, any other key and a peer without CURVE never reach the
server's handler, and the key files are this user's alone."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import zmq
import zmq.auth
from procs import descendants, start_up, wait_for, wait_until_stepping

from rlmq.common import security, transport, wire
from rlmq.common.security import Gatekeeper, Peer


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("run") / "keys"
    security.create_keys(directory, learners=1, actors=2)
    return directory


@pytest.fixture
def server(keys: Path) -> Iterator[tuple[zmq.Socket, str, list[tuple[str, bool]]]]:
    """A CURVE ROUTER behind a gatekeeper of the run's allow-list; the refusals it reported."""
    ctx = zmq.Context()
    held = security.load_keys(keys, None, serves=True)
    refused: list[tuple[str, bool]] = []
    gatekeeper = Gatekeeper(ctx, held.allowed, lambda key, first: refused.append((key, first)))
    gatekeeper.start()
    router = transport.make_socket(ctx, zmq.ROUTER)
    security.serve_securely(router, held)
    gatekeeper.watch(router)
    endpoint = transport.bind(router, "tcp://127.0.0.1:0")
    yield router, endpoint, refused
    router.close(0)
    gatekeeper.stop()
    ctx.term()


def client(ctx: zmq.Context, endpoint: str, keys: security.Keys | None) -> zmq.Socket:
    sock = transport.make_socket(ctx, zmq.DEALER)
    if keys is not None:
        security.connect_securely(sock, keys)
    sock.connect(endpoint)
    return sock


def test_the_keys_are_readable_by_this_user_alone(keys: Path) -> None:
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    files = sorted(p.name for p in keys.iterdir())
    assert files == sorted(
        [
            "allowed.json",
            "server.key",
            "server.key_secret",
            "learner-0.key",
            "learner-0.key_secret",
            "actor-0.key",
            "actor-0.key_secret",
            "actor-1.key",
            "actor-1.key_secret",
        ]
    )
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys.iterdir())
    actor = security.load_keys(keys, "actor-1", serves=False)
    assert actor.server_secret is None and not actor.allowed, "a client holds neither the servers' secret nor the list"


def test_a_listed_key_gets_in_as_its_role_and_name(keys: Path, server: tuple[zmq.Socket, str, list]) -> None:
    router, endpoint, refused = server
    ctx = zmq.Context()
    try:
        for name, peer in (("actor-1", Peer("actor", "actor-1")), ("learner-0", Peer("learner", "learner-0"))):
            sock = client(ctx, endpoint, security.load_keys(keys, name, serves=False))
            sock.send(b"hello from " + name.encode())
            assert router.poll(5000), f"{name} was not let in"
            _identity, part = router.recv_multipart(copy=False)
            assert part.bytes == b"hello from " + name.encode() and security.peer_of(part) == peer
            sock.close(0)
        assert refused == []
    finally:
        ctx.term()


def test_an_unlisted_key_and_a_plain_peer_never_reach_the_server(
    tmp_path: Path, keys: Path, server: tuple[zmq.Socket, str, list]
) -> None:
    """A key pair of another run (its own servers' key known: the worst case) is refused at the
    handshake however often it retries, and reported once as the first time; a peer without
    CURVE gets nowhere and is reported too (key ""). A listed key still gets in beside them."""
    router, endpoint, refused = server
    security.create_keys(tmp_path / "other", learners=0, actors=1)
    stranger = security.load_keys(tmp_path / "other", "actor-0", serves=False)
    stranger = security.Keys(
        security.load_keys(keys, None, serves=True).server_public, stranger.public, stranger.secret, None, {}
    )
    ctx = zmq.Context()
    try:
        socks = [client(ctx, endpoint, stranger) for _ in range(3)] + [client(ctx, endpoint, None)]
        for sock in socks:
            sock.send(b"let me in")
        assert not router.poll(1500), "a message from an unlisted or plain peer reached the server"
        keyed = [first for key, first in refused if key]  # each connection refused, the key new once
        assert len(keyed) >= 3 and keyed == [True] + [False] * (len(keyed) - 1)
        assert {key for key, _first in refused if key} == {stranger.public.decode()}  # type: ignore[union-attr]
        assert ("", True) in refused, "the peer without CURVE was not reported"
        friend = client(ctx, endpoint, security.load_keys(keys, "actor-0", serves=False))
        friend.send(b"me")
        assert router.poll(5000) and security.peer_of(router.recv_multipart(copy=False)[1]) == Peer("actor", "actor-0")
        for sock in [*socks, friend]:
            sock.close(0)
    finally:
        ctx.term()


def test_rlmq_keys_makes_a_runs_keys_once_and_names_the_fix_for_a_used_directory(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rlmq.cli", "keys", str(tmp_path / "keys"), "--learners", "2", "--actors", "3"]
    made = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    allowed = security.load_keys(tmp_path / "keys", None, serves=True).allowed
    assert sorted(p.user_id for p in allowed.values()) == [
        "actor:actor-0",
        "actor:actor-1",
        "actor:actor-2",
        "learner:learner-0",
        "learner:learner-1",
    ]
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "is not empty" in again.stderr and "choose another directory" in again.stderr
    assert security.load_keys(tmp_path / "keys", None, serves=True).allowed == allowed, "the keys were overwritten"


ROLLOUT = wire.Rollout(
    member=0,
    policy_version=10**6,
    actor="actor-0",
    obs=np.zeros((9, 4, 4), np.float32),
    actions=np.zeros((8, 4), np.int64),
    logprobs=np.zeros((8, 4), np.float32),
    rewards=np.full((8, 4), 1e6, np.float32),
    terminated=np.zeros((8, 4), bool),
    truncated=np.zeros((8, 4), bool),
    valid=np.ones((8, 4), bool),
)


def option(command: str, flag: str) -> str:
    return command.split(f"{flag} ")[1].split()[0]


def scrape(run_dir: Path, role: str) -> list[str]:
    """The /metrics of each `role` process of a run."""
    groups = json.loads((run_dir / "prometheus_targets.json").read_text())
    return [
        urllib.request.urlopen(f"http://{target}/metrics", timeout=10).read().decode()
        for g in groups
        if g["labels"]["role"] == role
        for target in g["targets"]
    ]


def count(metrics: str, reason: str) -> float:
    return sum(float(v) for v in re.findall(rf'rlmq_rejected_messages_total{{reason="{reason}"}} (\S+)', metrics))


def listens(ctx: zmq.Context, endpoint: str, keys: security.Keys | None, wait_ms: int) -> bool:
    """Whether a subscriber to the broadcast at `endpoint`, holding `keys`, gets through the CURVE
    handshake, after which it hears what is broadcast (stop directives, PBT decisions: seldom, so
    the handshake is what says it, from the socket's monitor)."""
    sub = transport.make_socket(ctx, zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    if keys is not None:
        security.connect_securely(sub, keys)
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(endpoint)
    try:
        return bool(monitor.poll(wait_ms))
    finally:
        sub.disable_monitor()
        monitor.close(0)
        sub.close(0)


@pytest.mark.slow
def test_a_secure_run_learns_while_clients_without_a_listed_key_get_nothing(tmp_path: Path) -> None:
    """`rlmq up`, secure by default: every process on CURVE with the run's keys, and the private
    Redis behind a password that no command line shows and that `rlmq status` finds. A client
    without keys and one with a key of another run each try everything a peer can: register as
    an actor, send weights, a report, a learner's report and a decision to the coordinator, push
    a rollout to a learner, and subscribe to the broadcast. None gets an answer or through the
    broadcast's handshake (which the run's own actor key does get through), and the coordinator and the learners
    count them (reason "auth"). The run's own actor key, saying Hello as learner rank 0, is let
    in and refused its claim (reason "role"); its report of 10^7 steps and 100 episodes of return
    500 counts only what its rollouts delivered. The run goes on learning to a mean return of 200
    (had the forgery counted, the run would have ended at once: its target is 475)."""
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--actors", "2", "--learners", "2", "--total-steps", "100000000", "--seed", "1")
    store = wait_until_stepping(run_dir, up)
    processes = descendants(up.pid)
    (coordinator,) = [cmd for cmd in processes.values() if "rlmq.cli coordinator" in cmd]
    control, broadcast = option(coordinator, "--control-bind"), option(coordinator, "--broadcast-bind")
    experience = [f"ipc://{option(cmd, '--experience-ipc')}" for cmd in processes.values() if "rlmq.cli learner" in cmd]
    assert len(experience) == 2
    # The private Redis wants the password `rlmq up` made, which no command line shows.
    info = json.loads((run_dir / "run.json").read_text())
    password = Path(info["redis_password_file"]).read_text().strip()
    assert len(password) >= 24 and stat.S_IMODE(Path(info["redis_password_file"]).stat().st_mode) == 0o600
    secret_keys = [zmq.auth.load_certificate(path)[1] for path in (run_dir / "keys").glob("*.key_secret")]
    assert len(secret_keys) == 1 + 2 + 2 and all(secret_keys)  # the servers', the learners', the actors'
    for secret in [password, *(key.decode() for key in secret_keys if key)]:
        assert not [cmd for cmd in descendants(up.pid).values() if secret in cmd], "a secret on a command line"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(info["redis_url"], socket_timeout=5).ping()
    for command in (
        ["status", "--run-dir", str(run_dir)],
        [
            "status",
            "--redis-url",
            info["redis_url"],
            "--run",
            info["run"],
            "--redis-password-file",
            info["redis_password_file"],
        ],
    ):
        shown = subprocess.run([sys.executable, "-m", "rlmq.cli", *command], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "state running" in shown.stdout, shown.stdout + shown.stderr
    security.create_keys(tmp_path / "other", learners=0, actors=1)
    theirs = security.load_keys(tmp_path / "other", "actor-0", serves=False)
    ours = security.load_keys(run_dir / "keys", "actor-1", serves=False)
    intruders = {
        "no keys": None,
        "another run's key": security.Keys(ours.server_public, theirs.public, theirs.secret, None, {}),
    }
    to_coordinator = [
        wire.Hello(role="actor", name="actor-0", pid=1),
        wire.Weights(member=0, version=10**6, params={"w": np.zeros(1, np.float32)}, final=True),
        wire.ActorReport(
            name="actor-0",
            member=0,
            env_steps=10**6,
            episode_returns=np.full(100, 500.0),
            episode_lengths=np.full(100, 500, np.int64),
        ),
        wire.LearnerReport(
            name="learner-0", rank=0, policy_version=10**6, updates=1, samples=1, stale_dropped=0, mean_policy_lag=0.0
        ),
        wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1.0}),
    ]
    ctx = zmq.Context()
    try:
        for what, keys in intruders.items():
            for endpoint, messages in [
                (control, to_coordinator),
                *[(e, [wire.Hello(role="actor", name="actor-0", pid=1, member=0), ROLLOUT]) for e in experience],
            ]:
                sock = client(ctx, endpoint, keys)
                for message in messages:
                    sock.send(wire.encode(message))
                assert not sock.poll(1000), f"{endpoint} answered a client with {what}"
                sock.close(0)
            assert not listens(ctx, broadcast, keys, 2000), f"the broadcast reached a client with {what}"
        assert listens(ctx, broadcast, ours, 30_000), (
            "the run's own actor key is refused by the broadcast: the test proves nothing"
        )
        sock = client(ctx, control, ours)
        sock.send(
            wire.encode(
                wire.Hello(role="learner", name="learner-0", pid=1, rank=0, experience_endpoint="tcp://127.0.0.1:9")
            )
        )
        assert not sock.poll(2000), "the coordinator answered an actor's key registering as learner 0"
        # The forgery, now with a listed key: it is heard (acknowledged), and counted only
        # as far as the learners took actor-1's rollouts, so it neither ends the run nor adds steps.
        sock.send(
            wire.encode(
                wire.ActorReport(
                    name="actor-1",
                    member=0,
                    env_steps=10**7,
                    episode_returns=np.full(100, 500.0),
                    episode_lengths=np.full(100, 500, np.int64),
                    session=999,
                    steps_total=10**7,
                    episodes_total=100,
                )
            )
        )
        assert sock.poll(5000) and isinstance(wire.decode(sock.recv()), wire.ReportAck)
        assert store.status().env_steps < 10**6
        sock.close(0)
    finally:
        ctx.term()

    def refusals() -> list[float]:  # the coordinator's, then each learner's
        return [count(m, "auth") for m in scrape(run_dir, "coordinator") + scrape(run_dir, "learner")]

    # Every server process refuses each intruder at least once. The counts come from the ZAP
    # handler's and the socket monitors' threads: they may trail the refusals a little.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: min(refusals()) >= len(intruders), 20, "the refusals counted")
    assert len(refusals()) == 1 + len(experience) and min(refusals()) >= len(intruders), refusals()
    assert count(scrape(run_dir, "coordinator")[0], "role") >= 1
    wait_for(lambda: (store.status().mean_return or 0) >= 200, 300, "a mean return of 200", up)
    up.send_signal(signal.SIGINT)
    output, _ = up.communicate(timeout=60)
    assert up.returncode == 130, output


ACTOR, LEARNER_0, LEARNER_1 = Peer("actor", "actor-3"), Peer("learner", "learner-0"), Peer("learner", "learner-1")
WEIGHTS = wire.Weights(member=0, version=1, params={"w": np.zeros(1, np.float32)})
FLEET = Peer("actor", security.ANY_ACTOR)


@pytest.mark.parametrize(
    "peer,message,allowed",
    [
        (ACTOR, wire.Hello(role="actor", name="actor-3", pid=1), True),
        (ACTOR, wire.Hello(role="actor", name="actor-4", pid=1), False),  # another actor's name
        (ACTOR, wire.Hello(role="learner", name="learner-0", pid=1, rank=0), False),  # an actor as a learner
        (ACTOR, wire.ActorReport(name="actor-3", member=0, env_steps=10), True),
        (ACTOR, wire.ActorReport(name="actor-4", member=0, env_steps=10), False),
        (
            ACTOR,
            wire.LearnerReport(
                name="learner-0", rank=0, updates=1, samples=1, policy_version=1, stale_dropped=0, mean_policy_lag=0.0
            ),
            False,
        ),
        (ACTOR, WEIGHTS, False),
        (LEARNER_1, wire.Hello(role="learner", name="learner-1", pid=1, rank=1), True),
        (LEARNER_1, wire.Hello(role="learner", name="learner-0", pid=1, rank=0), False),  # another rank
        (LEARNER_1, wire.LearnerHeartbeat(name="learner-1", rank=1, iteration=0, waiting_s=0.0), True),
        (LEARNER_1, WEIGHTS, False),  # only rank 0 publishes
        (LEARNER_0, WEIGHTS, True),
        (LEARNER_0, wire.ActorReport(name="actor-3", member=0, env_steps=10), False),
        # the coordinator's
        (LEARNER_0, wire.Decision(id=1, target=0, source=0, hyperparams={"learning_rate": 1e-3}), False),
        (None, WEIGHTS, True),  # a run without keys trusts its network
        (FLEET, wire.Hello(role="actor", name="rlmq-actor-7d9f-x2k4q", pid=1), True),  # the fleet's key: any actor
        (FLEET, wire.ActorReport(name="rlmq-actor-7d9f-x2k4q", member=0, env_steps=10), True),
        (FLEET, wire.Hello(role="learner", name="learner-0", pid=1, rank=0), False),  # but no learner
        (FLEET, WEIGHTS, False),
        (ACTOR, dataclasses.replace(ROLLOUT, actor="actor-3"), True),
        (ACTOR, ROLLOUT, False),  # another actor's rollout
    ],
)
def test_each_key_speaks_for_its_own_role_and_name_only(
    peer: Peer | None, message: wire.Message, allowed: bool
) -> None:
    assert (security.refusal(peer, message) == "") == allowed


def test_a_redis_password_leaves_the_url_for_a_private_file_and_comes_back(tmp_path: Path) -> None:
    """What `rlmq up` does with `--redis-url redis://:PASSWORD@host`: the coordinator is told the
    URL without it and a file (0600) holding it, and puts the two back together in memory."""
    from rlmq.cli.run_redis import redis_address
    from rlmq.common.redis_urls import shown_url, with_password

    url = "redis://:s3cr%2Ft@127.0.0.1:6390/2"
    address, password_file = redis_address(url, None, tmp_path)
    assert address == "redis://127.0.0.1:6390/2" and "s3cr" not in address
    assert Path(password_file).read_text().strip() == "s3cr/t"
    assert stat.S_IMODE(Path(password_file).stat().st_mode) == 0o600
    assert with_password(address, password_file) == url and "s3cr" not in shown_url(url)
    assert redis_address("redis://127.0.0.1:6390/0", None, tmp_path) == ("redis://127.0.0.1:6390/0", "")


def test_a_flood_of_actor_names_never_makes_a_learner_report_the_wire_refuses() -> None:
    """The fleet's key may name its rollouts as it likes: a learner reports the delivered totals of
    at most MAX_SEQUENCE names at a time, the names that grew first, and a few of the rest in turn."""
    from rlmq.common.codec import MAX_SEQUENCE
    from rlmq.learners.deliveries import RESENT_PER_REPORT, Deliveries

    names = [f"pod-{i}" for i in range(MAX_SEQUENCE + 10)]
    deliveries = Deliveries()
    for i, name in enumerate(names):  # 32 valid steps each; every other one ends an episode
        deliveries.add(
            dataclasses.replace(ROLLOUT, actor=name, terminated=np.eye(8, 4, k=-7, dtype=bool) & (i % 2 == 0))
        )
    reported: list[tuple[dict[str, int], dict[str, int]]] = []
    for _ in range(3):
        steps, episodes = deliveries.take()
        report = wire.decode(
            wire.encode(
                wire.LearnerReport(
                    name="learner-0",
                    rank=0,
                    policy_version=0,
                    updates=0,
                    samples=0,
                    stale_dropped=0,
                    mean_policy_lag=0.0,
                    session=deliveries.session,
                    delivered_steps=steps,
                    delivered_episodes=episodes,
                )
            )
        )
        assert isinstance(report, wire.LearnerReport) and len(report.delivered_steps) <= MAX_SEQUENCE
        reported.append((report.delivered_steps, report.delivered_episodes))
    # Two reports carry every name's totals; the rounds go on, a few names each.
    first, second, third = reported
    assert {**first[0], **second[0]} == dict.fromkeys(names, 32) and len(third[0]) == RESENT_PER_REPORT
    assert {**first[1], **second[1]} == {name: int(i % 2 == 0) for i, name in enumerate(names)}
    deliveries.add(dataclasses.replace(ROLLOUT, actor=names[-1]))  # a name that grew goes first
    assert next(iter(deliveries.take()[0].items())) == (names[-1], 64)


def test_a_flood_of_refused_keys_logs_a_bounded_number_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    """5,000 clients with keys of their own: each refusal is counted, the first keys are logged one
    by one, and the rest only as a count (at most once a minute), not a line each."""
    counted: list[str] = []
    ctx = zmq.Context()
    gatekeeper = security.Gatekeeper(ctx, {}, security.counting_refusals(lambda: counted.append("auth")))
    try:
        with caplog.at_level("WARNING", logger="rlmq.common.security"):
            for i in range(5000):
                assert not gatekeeper.callback("*", f"{i:040d}".encode())
        assert len(counted) == 5000
        assert len(caplog.records) == security.MAX_LOGGED_KEYS, len(caplog.records)
        gatekeeper.summarized_at -= security.REFUSED_SUMMARY_S
        with caplog.at_level("WARNING", logger="rlmq.common.security"):
            gatekeeper.callback("*", b"x" * 40)
        assert f"refused {5000 - security.MAX_LOGGED_KEYS + 1} more connection(s)" in caplog.records[-1].getMessage()
    finally:
        ctx.term()
