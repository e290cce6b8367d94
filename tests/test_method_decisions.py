"""The decisions of the population methods beyond PBT at the coordinator, against a real coordinator
process and Redis: CEM-RL's generations (coordinator/generations.py) and DvD's adaptive weight
(coordinator/bandit.py), each logged before it is applied and applied once across a crash in
between. A generation's draw is made again the same from the distribution logged with it, and a
member's fitness is taken only from episodes begun under its current draw."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq
from procs import start_coordinator, wait_for

from rlmq.common import envs, wire
from rlmq.common.algorithms import TD3Config
from rlmq.common.population import CEMConfig
from rlmq.common.transport import free_port
from rlmq.coordinator import bandit, cem
from rlmq.coordinator.store import RunStore
from rlmq.learners import td3
from tests.test_services import receive

TD3_SECTION = {"hidden_sizes": [8], "shared_critic": True}
CONFIG = {
    "env_id": "Pendulum-v1",
    "algo": "td3",
    "population": 3,
    "method": "cem",
    "td3": TD3_SECTION,
    "cem": {"elites": 2},  # CEM_CONFIG
    "evaluation": {"episodes": 0},  # fitness from the actors' reports
}


CEM_CONFIG = CEMConfig(elites=2)


def first_actors() -> list[dict[str, np.ndarray]]:
    """What a learner world of this config publishes first: each member's TD3 actor."""
    torch.manual_seed(0)
    algo = td3.TD3(
        envs.probe("Pendulum-v1", "td3"), TD3Config(hidden_sizes=(8,), shared_critic=True), 3, torch.device("cpu")
    )
    return [algo.member_params(m) for m in range(3)]


def as_learner_rank_0(sock: zmq.Socket) -> None:
    sock.send(wire.encode(wire.Hello(role="learner", name="learner-0", pid=1, rank=0, experience_endpoint="tcp://x:1")))
    assert isinstance(receive(sock), wire.Assign)


def learner_report(applied: int) -> bytes:
    return wire.encode(
        wire.LearnerReport(
            name="learner-0",
            rank=0,
            policy_version=0,
            updates=0,
            samples=0,
            stale_dropped=0,
            mean_policy_lag=0.0,
            applied_decision=applied,
        )
    )


def episodes(member: int, returns: list[float], lineages: list[int]) -> bytes:
    return wire.encode(
        wire.ActorReport(
            name=f"actor-{member}",
            member=member,
            env_steps=0,
            episode_returns=np.array(returns, np.float64),
            episode_lengths=np.full(len(returns), 200, np.int64),
            episode_lineages=np.array(lineages, np.int64),
        )
    )


class Coordinators:
    """One run's coordinator, started again and again on the same ports and Redis, and the sockets a
    test speaks to it through."""

    def __init__(self, start_service: Any, tmp_path: Path, redis_url: str, run_id: str, config: dict[str, Any]) -> None:
        self.where, self.config = (start_service, tmp_path, redis_url, run_id), config
        self.ports = {"control": free_port(), "broadcast": free_port(), "metrics": free_port()}
        self.store = RunStore.connect(redis_url, run_id)

    def start(self, name: str, crash_after_logging: bool = False) -> Any:
        env = {"RLMQ_FAILPOINT": "pbt-after-append"} if crash_after_logging else None
        started = start_coordinator(*self.where, ports=self.ports, name=name, env=env, **self.config)
        wait_for(lambda: self.store.members(), 30, "the population in Redis")
        return started["service"]

    def dealer(self) -> zmq.Socket:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{self.ports['control']}")
        return sock

    def decisions(self) -> zmq.Socket:
        """What learner rank 0 hears on the broadcast."""
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, wire.DECISION_TOPIC)
        sub.connect(f"tcp://127.0.0.1:{self.ports['broadcast']}")
        return sub


def test_a_dvd_weight_is_chosen_by_the_bandit_and_applied_once_across_a_crash(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    config = {
        **CONFIG,
        "population": 2,
        "method": "dvd",
        "td3": {**TD3_SECTION, "diversity_weight": 0.5},
        "dvd": {"adaptive": True, "interval": 100},
    }
    run = Coordinators(start_service, tmp_path, redis_url, run_id, config)
    first, store, sock = run.start("first", crash_after_logging=True), run.store, run.dealer()
    for member, value in enumerate((-700.0, -300.0)):  # the best fitness is -300, then 100 env steps
        sock.send(episodes(member, [value], [0]))
    wait_for(lambda: all(store.recent_returns(m) for m in range(2)), 10, "the returns")
    sock.send(wire.encode(wire.ActorReport(name="actor-0", member=0, env_steps=100)))
    assert first.process.wait(30) == 86, first.log()  # died between logging and applying
    (logged,) = store.diversity_weights()
    arm = bandit.choose([1], [-math.inf, -300.0], 2, np.random.default_rng([0, 1]))  # the run's seed, the id
    assert (logged.id, logged.fitness, logged.arm, logged.weight) == (1, -300.0, arm, (0.0, 0.5)[arm])
    assert store.applied_decision() == 0

    sub = run.decisions()
    second = run.start("second")
    wait_for(lambda: store.applied_decision() == 1, 30, "the logged weight applied")
    assert sub.poll(10_000), "the weight is handed to the learners"
    assert wire.decode(sub.recv_multipart()[1]) == wire.DiversityWeight(id=1, weight=logged.weight)
    as_learner_rank_0(sock)
    sock.send(learner_report(1))
    wait_for(lambda: store.status().learner_applied_decision == 1, 10, "the learner's report")
    sock.send(episodes(1, [-100.0], [0]))  # a new best, then the next interval
    wait_for(lambda: store.recent_returns(1)[:1] == [-100.0], 10, "the new return")
    sock.send(wire.encode(wire.ActorReport(name="actor-1", member=1, env_steps=100)))
    wait_for(lambda: store.applied_decision() == 2, 10, "the next choice")
    (chosen,) = store.diversity_weights(after=1)
    want = bandit.choose([1, arm], [-math.inf, -300.0, -100.0], 2, np.random.default_rng([0, 2]))
    assert (chosen.fitness, chosen.arm) == (-100.0, want)
    assert second.stop() == 0

    third = run.start("third")
    time.sleep(1.5)  # a few ticks: time to (wrongly) apply or choose again
    assert third.alive(), third.log()
    assert [w.id for w in store.diversity_weights()] == [1, 2] and store.applied_decision() == 2
    sock.close()
    sub.close()


def test_a_generation_is_applied_once_across_a_crash_and_judged_by_its_draws_own_episodes(
    start_service: Any, tmp_path: Path, redis_url: str, run_id: str
) -> None:
    run = Coordinators(start_service, tmp_path, redis_url, run_id, CONFIG)
    first, store = run.start("first", crash_after_logging=True), run.store
    # The members train with the config's hyperparameters: PBT's ranges are PBT's alone.
    base = {"learning_rate": 1e-3, "gamma": 0.99, "tau": 0.005}
    assert all(record.hyperparams == base for record in store.members().values())
    sock = run.dealer()
    as_learner_rank_0(sock)
    actors = first_actors()
    for member, params in enumerate(actors):  # the learners' first weights: generation 1 draws around member 0's
        sock.send(wire.encode(wire.Weights(member=member, version=1, params=params)))
    assert first.process.wait(30) == 86, first.log()  # died between logging and applying
    (logged,) = store.generations()
    assert (logged.id, logged.generation, logged.fitness, logged.trained) == (1, 1, {}, (0, 1))
    assert store.applied_decision() == 0 and store.decisions() == []
    initial = store.distribution(1)
    assert initial is not None and np.array_equal(initial.mean, cem.flatten(actors[0]))
    np.testing.assert_allclose(initial.variance, 1e-2)

    sub = run.decisions()
    second = run.start("second")
    wait_for(lambda: store.applied_decision() == 1, 30, "the logged generation applied")
    assert sub.poll(10_000), "the generation is handed to the learners"
    sent = wire.decode(sub.recv_multipart()[1])
    assert isinstance(sent, wire.Generation) and sent.id == 1 and sent.trained == (True, True, False)
    drawn = cem.sample(initial, 3, np.random.default_rng([0, 1]))  # the run's seed and the id
    for member in range(3):
        np.testing.assert_allclose(cem.flatten(dict(sent.actors[member])), drawn[member], rtol=1e-6)
        assert sent.actors[member]["policy.0.weight"].dtype == np.float32
    assert all(store.members()[m].generation == 1 for m in range(3))

    # Learner rank 0 takes it: every member's weights now descend from generation 1.
    as_learner_rank_0(sock)
    for member in range(3):
        sock.send(wire.encode(wire.Weights(member=member, version=2, params=dict(sent.actors[member]), copied_by=1)))
    sock.send(learner_report(1))
    wait_for(lambda: store.status().learner_applied_decision == 1, 10, "the learner's report")
    # An episode begun under the old weights (lineage 0; in another env slot it may end after one
    # of the draw's) is counted, but is no evidence of the draw.
    for member, value in enumerate((-300.0, -100.0, -200.0)):
        sock.send(episodes(member, [value, 5000.0], [1, 0]))
    wait_for(lambda: store.applied_decision() == 2, 10, "generation 2, once every draw played an episode")
    assert store.status().episodes == 6
    (second_generation,) = store.generations(after=1)
    assert second_generation.fitness == {"0": -300.0, "1": -100.0, "2": -200.0}
    assert second_generation.elites == (1, 2)
    moved = store.distribution(2)
    assert moved is not None and store.distribution(1) is None  # only the applied one is kept
    want = cem.update(
        initial, np.stack([cem.flatten(dict(a)) for a in sent.actors]), [-300.0, -100.0, -200.0], CEM_CONFIG
    )
    np.testing.assert_allclose(moved.mean, want.mean, rtol=1e-6)
    np.testing.assert_allclose(moved.variance, want.variance, rtol=1e-6)
    assert second.stop() == 0

    third = run.start("third")
    time.sleep(1.5)  # a few ticks: time to (wrongly) apply or draw anything again
    assert third.alive(), third.log()
    assert [g.id for g in store.generations()] == [1, 2] and store.applied_decision() == 2
    sock.close()
    sub.close()
