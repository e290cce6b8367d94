"""The run judges its policies itself: with a key stolen from an actor (a compromised env or
container has it), forged rollouts and reports reach the run's curves, never its verdict. Real
services, real CURVE sockets, a real Redis; the probe of issue 41 done again."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from rlmq.common import security, transport, wire
from rlmq.common.transport import free_port
from rlmq.coordinator.store import RunStore
from tests.helpers.procs import start_coordinator, wait_for

T, N = 8, 4  # the rollouts of write_run_config's run


def forged_rollout(actor: str, version: int) -> wire.Rollout:
    """Every step of every slot an episode's end."""
    return wire.Rollout(
        member=0,
        policy_version=version,
        actor=actor,
        obs=np.zeros((T + 1, N, 4), np.float32),
        actions=np.zeros((T, N), np.int64),
        logprobs=np.zeros((T, N), np.float32),
        rewards=np.ones((T, N), np.float32),
        terminated=np.ones((T, N), bool),
        truncated=np.zeros((T, N), bool),
        valid=np.ones((T, N), bool),
    )


def secure_client(ctx: zmq.Context, endpoint: str, keys: security.Keys) -> zmq.Socket:
    sock = transport.make_socket(ctx, zmq.DEALER)
    security.connect_securely(sock, keys)
    sock.connect(endpoint)
    return sock


def forge(ctx: zmq.Context, keys: security.Keys, name: str, experience: str, control: str, rollouts: int) -> None:
    """What the probe did: rollouts of nothing but episode ends, each on a credit of the learner's,
    then reports of 100 returns of 500 until the coordinator has counted them."""
    learner = secure_client(ctx, experience, keys)
    for _ in range(rollouts):
        learner.send(wire.encode(wire.Hello(role="actor", name=name, pid=1, member=0)))
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the learner granted the stolen key no credit"
            if learner.poll(250):
                message = wire.decode(learner.recv())
                if isinstance(message, wire.Credit):
                    learner.send(wire.encode(forged_rollout(name, message.policy_version)))
                    break
            else:
                learner.send(wire.encode(wire.Hello(role="actor", name=name, pid=1, member=0)))
    learner.close(0)
    coordinator = secure_client(ctx, control, keys)
    episodes = rollouts * T * N
    report = wire.ActorReport(
        name=name,
        member=0,
        env_steps=0,
        episode_returns=np.full(100, 500.0),
        episode_lengths=np.full(100, 500, np.int64),
        session=int(time.time_ns() % 2**40),
        steps_total=episodes,
        episodes_total=episodes,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its episodes are counted, as an actor does
        coordinator.send(wire.encode(report))
        if coordinator.poll(500):
            ack = wire.decode(coordinator.recv())
            if isinstance(ack, wire.ReportAck) and ack.episodes_uncounted == 0:
                break
        time.sleep(0.25)
    coordinator.close(0)


@pytest.mark.slow
def test_forged_rollouts_and_reports_with_a_stolen_key_do_not_end_the_run_a_success(
    start_service: Any,
    tmp_path: Path,
    redis_url: str,
    run_id: str,
) -> None:
    """A CartPole run that cannot reach 475 (a learning rate of 1e-8 keeps its first weights; 40,000 env steps),
    secured by keys with a fleet key (Kubernetes'), actor-1 collecting. First actor-0's key (its
    process gone, its key taken), then the fleet's under a brand-new actor name, each sends
    rollouts of nothing but episode ends and reports of 100 returns of 500: the reported mean
    reaches the target each time and asks for an evaluation, whose episodes say no; the run ends
    on its budget, a failure."""
    keys = tmp_path / "keys"
    security.create_keys(keys, learners=1, actors=2, fleet=True)
    coord = start_coordinator(
        start_service,
        tmp_path,
        redis_url,
        run_id,
        args=("--keys", str(keys)),
        target_return=475.0,
        total_steps=40_000,  # room for both forgeries on a loaded host (20,000 ran out once)
        ppo={"learning_rate": 1e-8},
    )
    control, broadcast = f"tcp://127.0.0.1:{coord['control']}", f"tcp://127.0.0.1:{coord['broadcast']}"
    experience = free_port()
    start_service(
        "learner",
        "learner",
        "--run",
        run_id,
        "--coordinator",
        control,
        "--broadcast",
        broadcast,
        "--rank",
        "0",
        "--world-size",
        "1",
        "--master-port",
        str(free_port()),
        "--metrics-port",
        "-1",
        "--experience-port",
        str(experience),
        "--checkpoint-dir",
        str(tmp_path / "checkpoints"),
        "--keys",
        str(keys),
    )
    start_service(
        "actor",
        "actor",
        "--name",
        "actor-1",
        "--coordinator",
        control,
        "--broadcast",
        broadcast,
        "--metrics-port",
        "-1",
        "--keys",
        str(keys),
    )
    store = RunStore.connect(redis_url, run_id)
    wait_for(lambda: store.status().env_steps > 0, 120, "the actor stepping", coord["service"].process)
    ctx = zmq.Context()
    try:
        for key, name in (("actor-0", "actor-0"), (security.FLEET, "actor-new")):
            asked = store.status().evaluations
            forge(
                ctx,
                security.load_keys(keys, key, serves=False),
                name,
                f"tcp://127.0.0.1:{experience}",
                control,
                rollouts=4,
            )
            status = wait_for(
                lambda asked=asked: (s := store.status()).evaluations > asked and s,
                30,
                f"an evaluation asked for by the forgery with {key}'s key",
            )
            # Not ended by it: still running, or (on a loaded host) ending on its budget.
            assert status.evaluated_return < 475 and status.reason != "target", status
    finally:
        ctx.term()
    status = wait_for(lambda: (s := store.status()).state == "done" and s, 120, "the run's end")
    assert status.reason == "budget" and status.success is False, status
    assert status.evaluations >= 2 and (status.evaluated_return or 0) < 475
