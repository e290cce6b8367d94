"""The coordinator's handlers, in-process, against a real Redis server (no sockets needed here:
`Coordinator.handle` is what its loop calls for every message it receives), and its own evaluator
(a real child process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from rlmq.common import wire
from rlmq.common.config import CoordinatorConfig, EvaluationConfig, PBTConfig, RunConfig
from rlmq.common.service import StopFlag
from rlmq.coordinator.coordinator import Coordinator
from rlmq.coordinator.store import RunStore


def started(redis_url: str, run_id: str, **fields: Any) -> Coordinator:
    run_config = RunConfig(**{"env_id": "CartPole-v1", "target_return": 475.0, "total_steps": 1_000_000, **fields})
    cfg = CoordinatorConfig(
        run=run_id,
        redis_url=redis_url,
        run_config=run_config,
        metrics_port=-1,
        control_bind="tcp://127.0.0.1:0",
        broadcast_bind="tcp://127.0.0.1:0",
    )
    return Coordinator(cfg, RunStore.connect(redis_url, run_id), StopFlag())


@pytest.fixture
def coordinator(redis_url: str, run_id: str) -> Iterator[Coordinator]:
    """A coordinator that believes its actors' returns (a trusted network: evaluation.episodes = 0)."""
    coordinator = started(redis_url, run_id, evaluation=EvaluationConfig(episodes=0))
    yield coordinator
    coordinator.close()
    coordinator.store.delete_run()


@pytest.fixture
def judging(redis_url: str, run_id: str) -> Iterator[Coordinator]:
    """A coordinator with its own evaluator (the default), whose single agent's policy is one hidden unit."""
    coordinator = started(redis_url, run_id, hidden_sizes=(4,))
    coordinator.publisher = b"learner-0"
    yield coordinator
    coordinator.close()
    coordinator.store.delete_run()


def report(returns: list[float], env_steps: int = 1_000, member: int = 0) -> bytes:
    return wire.encode(
        wire.ActorReport(
            name=f"actor-{member}",
            member=member,
            env_steps=env_steps,
            episode_returns=np.asarray(returns, np.float64),
            episode_lengths=np.full(len(returns), 500, np.int64),
        )
    )


def weights(member: int, version: int, balances: bool, final: bool = False) -> bytes:
    """A CartPole policy through one hidden unit: pushes the way the pole falls (500 every episode),
    or, with the unit cut off, always left (about 9)."""
    hidden = np.zeros((4, 4), np.float32)
    hidden[0] = [0.1, 0.5, 1.0, 1.0]
    out = np.zeros((2, 4), np.float32)
    out[1, 0] = 100.0 if balances else 0.0
    params = {
        "policy.0.weight": hidden,
        "policy.0.bias": np.zeros(4, np.float32),
        "policy.2.weight": out,
        "policy.2.bias": np.zeros(2, np.float32),
    }
    return wire.encode(wire.Weights(member=member, version=version, params=params, final=final))


def evaluate_until(coordinator: Coordinator, done: Callable[[], bool], timeout_s: float = 60) -> None:
    """The coordinator's loop, for its evaluator's socket alone."""
    assert coordinator.judge is not None
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "no evaluation came back"
        coordinator.judge.socket.poll(100)
        coordinator.evaluate()


def test_reports_that_reach_the_target_only_ask_the_runs_own_evaluation_which_decides(judging: Coordinator) -> None:
    """The actors' word (100 returns of 500) asks for an evaluation of the newest weights; the
    evaluator's episodes of a policy that falls over say no, and the run goes on. Newer weights that
    balance the pole are evaluated when the reports say so again, and end the run a success."""
    judging.handle(b"learner-0", weights(0, 1, balances=False))
    judging.handle(b"actor-0", report([500.0] * 100))
    assert judging.end.finished_at is None and judging.judge is not None and judging.judge.evaluator.busy
    evaluate_until(judging, lambda: judging.store.status().evaluated_return is not None)
    status = judging.store.status()
    assert status.evaluated_return is not None and status.evaluated_return < 20
    assert (status.evaluated_version, status.evaluated_episodes, status.evaluated_deterministic) == (1, 10, True)
    judging.on_tick()
    assert judging.end.finished_at is None and judging.store.status().state == "running"
    judging.handle(b"learner-0", weights(0, 2, balances=True))
    judging.handle(b"actor-0", report([500.0]))
    evaluate_until(judging, lambda: judging.end.passed is not None)
    judging.on_tick()
    status = judging.store.status()
    assert judging.end.finished_at is not None and status.success is True and status.reason == "target"
    assert status.evaluated_return == 500.0 and status.evaluated_version == 2
    assert "500.0 ± 0.0 over 10 deterministic evaluation episodes (member 0, version 2) ≥ 475" in status.detail


def test_with_evaluation_every_s_the_newest_weights_are_judged_though_no_actor_reported(
    judging: Coordinator, redis_url: str
) -> None:
    """Many actors per learner report returns of episodes begun many versions ago (issue 45): with
    `evaluation.every_s` the run evaluates its newest weights on a clock too, and ends on them.
    Without it, a tick asks for nothing until the reports reach the target."""
    judging.handle(b"learner-0", weights(0, 1, balances=True))
    judging.on_tick()
    assert judging.judge is not None and not judging.judge.evaluator.busy
    clocked = started(
        redis_url, judging.cfg.run + "-clocked", hidden_sizes=(4,), evaluation=EvaluationConfig(every_s=0.01)
    )
    clocked.publisher = b"learner-0"
    try:
        clocked.handle(b"learner-0", weights(0, 1, balances=True))
        time.sleep(0.02)
        clocked.on_tick()
        assert clocked.judge is not None and clocked.judge.evaluator.busy
        evaluate_until(clocked, lambda: clocked.end.passed is not None)
        clocked.on_tick()
        status = clocked.store.status()
        assert clocked.end.finished_at is not None and status.success is True and status.evaluated_version == 1
        assert status.episodes == 0  # no actor said a word
    finally:
        clocked.close()
        clocked.store.delete_run()


def test_pbt_copies_the_member_the_evaluations_rank_first_whatever_its_actors_claim(
    redis_url: str,
    run_id: str,
) -> None:
    """Member 0's actor claims 500s for weights that fall over, member 1's claims 10s for weights
    that balance: when both are due, each is evaluated, and truncation has member 0 copy member 1."""
    coordinator = started(
        redis_url, run_id, hidden_sizes=(4,), population=2, pbt=PBTConfig(interval=1_000, fraction=0.5)
    )
    coordinator.publisher = b"learner-0"
    try:
        for member, balances in ((0, False), (1, True)):
            coordinator.handle(b"learner-0", weights(member, 1, balances))
            coordinator.handle(b"actor-0", report([10.0 if balances else 500.0] * 20, member=member))
        coordinator.on_tick()  # both due: both asked for, one at a time
        assert coordinator.population.applied == 0
        evaluate_until(coordinator, lambda: len(coordinator.judge.latest) == 2 if coordinator.judge else False)
        coordinator.on_tick()
        (decision,) = coordinator.store.decisions(after=0)
        assert (decision.target, decision.source, decision.kind) == (0, 1, "exploit")
        assert decision.fitness == {"0": pytest.approx(9.4, abs=2), "1": 500.0}
    finally:
        coordinator.close()
        coordinator.store.delete_run()


def test_a_population_names_its_best_member_by_the_evaluations_of_every_members_final_weights(
    redis_url: str, run_id: str
) -> None:
    """Member 0's actor claims 500s for weights that fall over, member 1's claims 10s for weights
    that balance. Their returns rank member 0 first while the run lasts; once the budget is spent
    and the final weights are in, every member's are evaluated and member 1, whose final weights
    balance, is the best member that the summary, `rlmq eval` and the status name."""
    coordinator = started(
        redis_url,
        run_id,
        hidden_sizes=(4,),
        population=3,
        target_return=None,
        total_steps=3_000,
        pbt=PBTConfig(interval=10**6),
    )
    coordinator.publisher = b"learner-0"
    try:
        for member, balances in ((0, False), (1, True), (2, False)):
            coordinator.handle(b"learner-0", weights(member, 1, balances))
            coordinator.handle(b"actor-0", report([10.0 if balances else 500.0] * 20, member=member))
        assert coordinator.end.finished_at is not None and coordinator.store.status().best_member == 0
        for member, balances in ((0, False), (1, True), (2, False)):
            coordinator.handle(b"learner-0", weights(member, 2, balances, final=member == 2))
        final_report = wire.LearnerReport(
            name="learner-0",
            rank=0,
            policy_version=2,
            updates=2,
            samples=1,
            stale_dropped=0,
            mean_policy_lag=0.0,
            final=True,
        )
        coordinator.handle(b"learner-0", wire.encode(final_report))
        evaluate_until(coordinator, coordinator.on_tick)  # the wind-down's ticks, until done
        assert coordinator.judge is not None
        assert {m: judged.version for m, judged in coordinator.judge.latest.items()} == {0: 2, 1: 2, 2: 2}
        status = coordinator.store.status()
        assert (status.state, status.best_member, status.evaluated_member, status.evaluated_version) == (
            "done",
            1,
            1,
            2,
        )
        assert status.evaluated_return == 500.0
    finally:
        coordinator.close()
        coordinator.store.delete_run()


def test_the_report_that_reaches_the_target_ends_the_run_without_waiting_for_a_tick(
    coordinator: Coordinator,
) -> None:
    coordinator.handle(b"actor-0", report([470.0] * 99))
    assert coordinator.end.finished_at is None  # 99 episodes: the window is not full yet
    coordinator.handle(b"actor-0", report([470.0]))
    assert coordinator.end.finished_at is None  # full, but a mean of 470
    coordinator.handle(b"actor-0", report([500.0] * 20))  # the newest 100: 20 × 500 + 80 × 470 = 476 each
    assert coordinator.end.finished_at is not None
    status = coordinator.store.status()
    assert status.state == "stopping" and status.success is True
    assert status.mean_return == 476.0 and status.best_member == 0  # what ended it, for summary.json
    last = coordinator.store.progress()[-1]  # metrics.csv and the learning curve end on it too
    assert last.mean_return == 476.0 and last.env_steps == 3_000
    assert status.env_steps_at_end == 3_000 == status.env_steps


def test_the_step_budget_ends_the_run_on_the_report_that_reaches_it(coordinator: Coordinator) -> None:
    coordinator.handle(b"actor-0", report([], env_steps=999_999))
    assert coordinator.end.finished_at is None
    coordinator.handle(b"actor-0", report([], env_steps=1))
    status = coordinator.store.status()
    assert coordinator.end.finished_at is not None and status.success is False and status.reason == "budget"


def test_actors_get_learner_endpoints_only_once_every_rank_of_a_restarted_world_registered(
    redis_url: str, run_id: str
) -> None:
    """A learner rank registering from a new process means its world restarted: until every rank
    of the new world has registered, an actor that says Hello waits, rather than being handed the
    endpoints of learners that are gone."""
    run_config = RunConfig(env_id="CartPole-v1", num_learners=2)
    cfg = CoordinatorConfig(
        run=run_id,
        redis_url=redis_url,
        run_config=run_config,
        metrics_port=-1,
        control_bind="tcp://127.0.0.1:0",
        broadcast_bind="tcp://127.0.0.1:0",
    )
    coordinator = Coordinator(cfg, RunStore.connect(redis_url, run_id), StopFlag())
    ctx = zmq.Context.instance()
    sockets: list[zmq.Socket] = []

    def say(identity: bytes, message: wire.Message) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(coordinator.sockets.control_endpoint)
        sock.send(wire.encode(message))
        sockets.append(sock)
        assert coordinator.sockets.control.poll(5_000, zmq.POLLIN)
        coordinator.handle(*coordinator.sockets.control.recv_multipart())
        return sock

    def learner(rank: int, world: str) -> None:
        say(
            f"learner-{rank}-{world}".encode(),
            wire.Hello(
                role="learner", name=f"learner-{rank}", pid=1, rank=rank, experience_endpoint=f"tcp://{world}:{rank}"
            ),
        )

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
