"""The coordinator's handlers, in-process, against a real Redis server (no sockets needed here:
`Coordinator.handle` is what its loop calls for every frame it receives)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from rlmq.common import wire
from rlmq.common.config import CoordinatorConfig, RunConfig
from rlmq.common.service import StopFlag
from rlmq.coordinator.coordinator import Coordinator
from rlmq.coordinator.store import RunStore


@pytest.fixture
def coordinator(redis_url: str, run_id: str) -> Iterator[Coordinator]:
    run_config = RunConfig(env_id="CartPole-v1", target_return=475.0, total_steps=1_000_000)
    cfg = CoordinatorConfig(run=run_id, redis_url=redis_url, run_config=run_config, metrics_port=-1,
                            control_bind="tcp://127.0.0.1:0", broadcast_bind="tcp://127.0.0.1:0")
    store = RunStore.connect(redis_url, run_id)
    coordinator = Coordinator(cfg, store, StopFlag())
    yield coordinator
    coordinator.close()
    store.delete_run()


def report(returns: list[float], env_steps: int = 1_000) -> bytes:
    return wire.encode(wire.ActorReport(name="actor-0", member=0, env_steps=env_steps,
                                        episode_returns=np.asarray(returns, np.float64),
                                        episode_lengths=np.full(len(returns), 500, np.int64)))


def test_the_report_that_reaches_the_target_ends_the_run_without_waiting_for_a_tick(
    coordinator: Coordinator,
) -> None:
    coordinator.handle(b"actor-0", report([470.0] * 99))
    assert coordinator.finished_at is None  # 99 episodes: the window is not full yet
    coordinator.handle(b"actor-0", report([470.0]))
    assert coordinator.finished_at is None  # full, but a mean of 470
    coordinator.handle(b"actor-0", report([500.0] * 20))  # the newest 100: 20 × 500 + 80 × 470 = 476 each
    assert coordinator.finished_at is not None
    status = coordinator.store.status()
    assert status.state == "stopping" and status.success is True
    assert status.mean_return == 476.0 and status.best_member == 0  # what ended it, for summary.json
    last = coordinator.store.progress()[-1]  # metrics.csv and the learning curve end on it too
    assert last.mean_return == 476.0 and last.env_steps == 3_000
    assert status.env_steps_at_end == 3_000 == status.env_steps


def test_the_step_budget_ends_the_run_on_the_report_that_reaches_it(coordinator: Coordinator) -> None:
    coordinator.handle(b"actor-0", report([], env_steps=999_999))
    assert coordinator.finished_at is None
    coordinator.handle(b"actor-0", report([], env_steps=1))
    status = coordinator.store.status()
    assert coordinator.finished_at is not None and status.success is False and status.reason == "budget"


def test_actors_get_learner_endpoints_only_once_every_rank_of_a_restarted_world_registered(
    redis_url: str, run_id: str
) -> None:
    """A learner rank registering from a new process means its world restarted: until every rank
    of the new world has registered, an actor that says Hello waits, rather than being handed the
    endpoints of learners that are gone."""
    run_config = RunConfig(env_id="CartPole-v1", num_learners=2)
    cfg = CoordinatorConfig(run=run_id, redis_url=redis_url, run_config=run_config, metrics_port=-1,
                            control_bind="tcp://127.0.0.1:0", broadcast_bind="tcp://127.0.0.1:0")
    coordinator = Coordinator(cfg, RunStore.connect(redis_url, run_id), StopFlag())
    ctx = zmq.Context.instance()
    sockets: list[zmq.Socket] = []

    def say(identity: bytes, message: wire.Message) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(coordinator.control_endpoint)
        sock.send(wire.encode(message))
        sockets.append(sock)
        assert coordinator.control.poll(5_000, zmq.POLLIN)
        coordinator.handle(*coordinator.control.recv_multipart())
        return sock

    def learner(rank: int, world: str) -> None:
        say(f"learner-{rank}-{world}".encode(), wire.Hello(role="learner", name=f"learner-{rank}", pid=1, rank=rank,
                                                          experience_endpoint=f"tcp://{world}:{rank}"))

    def assigned(actor: zmq.Socket) -> tuple[str, ...] | None:
        if not actor.poll(200, zmq.POLLIN):
            return None
        message = wire.decode(actor.recv())
        assert isinstance(message, wire.Assign)
        return message.learner_endpoints

    try:
        learner(0, "old")
        first = say(b"actor-0-1", wire.Hello(role="actor", name="actor-0", pid=1))
        assert assigned(first) is None  # rank 1 has not registered yet
        learner(1, "old")
        assert assigned(first) == ("tcp://old:0", "tcp://old:1")
        learner(1, "new")  # rank 1 from a new process: the world restarted
        second = say(b"actor-1-1", wire.Hello(role="actor", name="actor-1", pid=1))
        assert assigned(second) is None and coordinator.learners.live() == 1
        learner(0, "new")
        assert assigned(second) == ("tcp://new:0", "tcp://new:1")
    finally:
        for sock in sockets:
            sock.close(linger=0)
        coordinator.close()
        coordinator.store.delete_run()
