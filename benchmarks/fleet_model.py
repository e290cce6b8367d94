"""The capacity model of a fleet (issue 45; docs/architecture.md, "Capacity"): its unit costs,
each measured alone on this host (`calibrate`), and what they predict: for a measured fleet of
simulated identities (`model`, beside benchmarks/bench_fleet.py's figures), and for fleets no
machine here holds (`model_table`: 64, 1,000 and 10,000 actors of three kinds).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from rlmq.cli.redis_server import RedisServer
from rlmq.common import security, transport, wire
from rlmq.common.config import CoordinatorConfig
from rlmq.common.loading import load_run_config
from rlmq.common.service import StopFlag
from rlmq.coordinator.coordinator import TICK_S, Coordinator
from rlmq.coordinator.report_budget import report_interval
from rlmq.coordinator.store import RunStore
from rlmq.learners.credits import CreditLedger, CreditTimeouts
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ACTOR_TIMEOUT_S = CoordinatorConfig.actor_timeout_s  # FleetRun's coordinator keeps the default


def cpu_s(pid: int) -> float:
    """User + system seconds of every thread of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of `pid` now (VmHWM: its peak), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclasses.dataclass(frozen=True)
class UnitCosts:
    """What one message or connection costs, each measured alone (`calibrate`): the capacity
    model's constants (docs/architecture.md, "Capacity")."""

    report_cpu_s: float  # the coordinator's CPU for one actor report: decode, count (Redis), ack
    report_wall_s: float  # its wall time: the CPU and the Redis round trip
    report_redis_cpu_s: float  # Redis's CPU for it (the counting script)
    weights_cpu_s: float  # the coordinator's CPU for one Weights from learner rank 0: checked, kept, stored
    tick_cpu_s: float  # its CPU for one tick (status, progress, PBT) with `names` actors live
    hello_cpu_s: float  # a learner's CPU for one renewed request for credit: decoded, kept in its ledger
    redis_bytes_per_actor: float  # Redis memory an actor's records take (liveness, counts, tally)
    connection_kb: float  # resident memory of one end of a CURVE connection
    connection_idle_cpu_s: float  # CPU a second of one end of an idle CURVE connection (ZMTP heartbeats)
    broadcast_cpu_s_per_mb: float  # a PUB's CPU per MB sent to CURVE subscribers (encryption, I/O)


def calibrate(root: Path, names: int = 256, rounds: int = 12) -> UnitCosts:
    """The unit costs, on this host, in this process (no fleet running)."""
    config = dataclasses.replace(load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {}), total_steps=10**12)
    keys = root / "keys"
    security.create_keys(keys, learners=1, actors=0, fleet=True)
    redis = RedisServer(root / "redis", persist=False)
    cfg = CoordinatorConfig(
        run="calibrate",
        redis_url=redis.url,
        run_config=config,
        metrics_port=-1,
        control_bind="tcp://127.0.0.1:0",
        broadcast_bind="tcp://127.0.0.1:0",
        keys_dir=str(keys),
    )
    coordinator = Coordinator(cfg, RunStore.connect(redis.url, "calibrate"), StopFlag())
    try:
        # The learner says it took everything the reports claim: their steps count in full.
        coordinator.store.add_deliveries(
            1, {f"sim-{i}": 10**9 for i in range(names)}, {f"sim-{i}": 10**6 for i in range(names)}
        )
        used_before = int(coordinator.store.redis.info("memory")["used_memory"])

        def reports(k: int) -> list[bytes]:  # each name's k-th report: a rollout of 256 steps, now and then an episode
            return [
                wire.encode(
                    wire.ActorReport(
                        name=f"sim-{i}",
                        member=0,
                        env_steps=256,
                        episode_returns=np.full(k % 2, 200.0),
                        episode_lengths=np.full(k % 2, 200, np.int64),
                        session=i + 1,
                        steps_total=256 * k,
                        episodes_total=(k + 1) // 2,
                    )
                )
                for i in range(names)
            ]

        for encoded in reports(1):  # every name's records made
            coordinator.handle(b"calibrate", encoded)
        used_after = int(coordinator.store.redis.info("memory")["used_memory"])
        messages = [encoded for k in range(2, rounds + 2) for encoded in reports(k)]
        cpu, wall, redis_cpu = time.process_time(), time.perf_counter(), cpu_s(redis.process.pid)
        for encoded in messages:
            coordinator.handle(b"calibrate", encoded)
        n = len(messages)
        report_cpu = (time.process_time() - cpu) / n
        report_wall = (time.perf_counter() - wall) / n
        report_redis = (cpu_s(redis.process.pid) - redis_cpu) / n
        coordinator.publisher = b"learner-0"
        params = to_numpy_params(ActorCritic(coordinator.spec, config.hidden_sizes))
        weights = [wire.encode(wire.Weights(member=0, version=v, params=params)) for v in range(1, 101)]
        cpu = time.process_time()
        for encoded in weights:
            coordinator.handle(b"learner-0", encoded)
        weights_cpu = (time.process_time() - cpu) / len(weights)
        cpu = time.process_time()
        for _ in range(20):
            coordinator.on_tick()
        tick_cpu = (time.process_time() - cpu) / 20
    finally:
        coordinator.close()
        redis.stop()
    connection_kb, idle_cpu, broadcast_cpu = curve_connections(keys, names)
    ledger = CreditLedger(1, CreditTimeouts())
    hellos = [wire.encode(wire.Hello(role="actor", name=f"sim-{i}", pid=1, member=0)) for i in range(names)]
    cpu = time.process_time()
    for _ in range(rounds):
        for i, encoded in enumerate(hellos):
            hello = wire.decode(encoded)
            assert isinstance(hello, wire.Hello)
            ledger.hello(b"sim-%d" % i, time.monotonic(), hello.name)
    hello_cpu = (time.process_time() - cpu) / (rounds * names)
    return UnitCosts(
        report_cpu,
        report_wall,
        report_redis,
        weights_cpu,
        tick_cpu,
        hello_cpu,
        (used_after - used_before) / names,
        connection_kb,
        idle_cpu,
        broadcast_cpu,
    )


def curve_connections(
    keys_dir: Path, clients: int, message_bytes: int = 37_000, messages: int = 20, idle_s: float = 4.0
) -> tuple[float, float, float]:
    """(KB of resident memory per end of a CURVE connection, its CPU seconds a second while idle
    (heartbeats), CPU seconds per MB a PUB sends to CURVE subscribers): `clients` SUB sockets
    connected to a PUB, both ends in this process (so each figure is half of what both ends took)."""
    server_keys = security.load_keys(keys_dir, None, serves=True)
    client_keys = security.load_keys(keys_dir, security.FLEET, serves=False)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 2 * clients + 16)
    pub = transport.make_socket(ctx, zmq.PUB, hwm=100)
    security.serve_securely(pub, server_keys)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    before = rss_mb(os.getpid())
    subs = []
    for _ in range(clients):
        sub = transport.make_socket(ctx, zmq.SUB, hwm=100)
        security.connect_securely(sub, client_keys)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        subs.append(sub)
    encoded = bytes(message_bytes)
    deadline = time.monotonic() + 30
    while not all(sub.poll(0) for sub in subs) and time.monotonic() < deadline:  # every handshake done
        pub.send(encoded)
        time.sleep(0.05)
        for sub in subs:
            while sub.poll(0):
                sub.recv()
    connection_kb = (rss_mb(os.getpid()) - before) * 1024 / (2 * clients)
    cpu = time.process_time()
    time.sleep(idle_s)  # nothing sent: what the connections cost while idle
    idle_cpu = (time.process_time() - cpu) / idle_s / (2 * clients)
    cpu = time.process_time()
    for _ in range(messages):
        pub.send(encoded)
        for sub in subs:
            if sub.poll(10_000):  # bounded: a subscriber that never connected holds nothing up
                sub.recv()
    broadcast_cpu = (time.process_time() - cpu) / 2 / (messages * clients * message_bytes / 1e6)
    for sock in (pub, *subs):
        sock.close(0)
    ctx.term()
    return connection_kb, idle_cpu, broadcast_cpu


def model(
    costs: UnitCosts, measured: dict[str, Any], run_interval_s: float, actor_timeout_s: float, rebroadcast: bool
) -> dict[str, float]:
    """What the capacity model predicts for the measured fleet, given what sets the pace: the
    learner's updates and rollouts per second and the weights' size (its inputs U, R and W)."""
    actors = measured["identities"]
    interval = (
        run_interval_s
        if rebroadcast  # the tree before issue 45: a fixed report interval
        else report_interval(run_interval_s, actors, costs.report_wall_s, actor_timeout_s)
    )
    reports = actors / interval
    weights_bytes = measured["encoded_weights_bytes"]
    broadcast_mb = actors * measured["updates_per_s"] * weights_bytes / 1e6 if rebroadcast else 0.0
    return {
        "reports_per_s": reports,
        "coordinator_cpu": reports * costs.report_cpu_s
        + measured["updates_per_s"] * costs.weights_cpu_s
        + costs.tick_cpu_s / TICK_S * max(1.0, actors / 256)
        + 2 * actors * costs.connection_idle_cpu_s
        + broadcast_mb * costs.broadcast_cpu_s_per_mb,
        "redis_cpu": reports * costs.report_redis_cpu_s,
        "coordinator_rss_mb": measured["coordinator_rss_before_mb"] + 2 * actors * costs.connection_kb / 1024,
        "broadcast_mb_per_s": broadcast_mb,
        "credit_requests_per_s": actors / wire.CREDIT_REQUEST_RENEW_S,
        "learner_hello_cpu": actors / wire.CREDIT_REQUEST_RENEW_S * costs.hello_cpu_s,
        "learner_weights_mb_per_s": measured["rollouts_per_s"] * weights_bytes / 1e6,
    }


@dataclasses.dataclass(frozen=True)
class Fleet:
    """What sets a fleet's pace, the capacity model's inputs: a learner world of `ranks` training
    `rollouts_per_s` rollouts and `updates_per_s` updates a second, weights of `weights_bytes`."""

    name: str
    weights_bytes: float
    updates_per_s: float
    rollouts_per_s: float
    ranks: int = 1
    actors_per_host: int = 10


# CartPole: this 2-core host's simulated fleet (PPO, one rollout an update). LunarLander: the shipped
# PPO config on the H100 box with 14 actors (LOG §14: 88 k env steps/s in batches of ~37 k samples of
# 8 × 1,024-step rollouts). Pong: the Nature CNN (1.69 M parameters) on the H200 box (LOG §15:
# 10.6 k env steps/s in 32 × 64-step rollouts, batches of up to 4).
FLEETS = (
    Fleet("CartPole MLP", 37_050, 25.0, 25.0),
    Fleet("LunarLander MLP", 40_000, 2.4, 10.7),
    Fleet("Atari CNN", 6_751_000, 2.6, 5.2),
)
NIC_BYTES_PER_S = 1.25e9  # 10 Gbit/s


def model_table(costs: UnitCosts, sizes: tuple[int, ...] = (64, 1_000, 10_000)) -> list[dict[str, Any]]:
    """The model at fleet sizes no machine here holds: each resource's load as a fraction of what it
    has (one core for the coordinator's thread, half a core for a learner's requests for credit, a
    10 Gbit/s NIC), and the one that runs out first; with the rebroadcast the blueprint had and now."""
    rows = []
    for fleet in FLEETS:
        for actors in sizes:
            interval = report_interval(0.25, actors, costs.report_wall_s, ACTOR_TIMEOUT_S)
            reports = actors / interval
            broadcast = actors * fleet.updates_per_s * fleet.weights_bytes
            load = {
                "coordinator thread": reports * costs.report_wall_s
                + fleet.updates_per_s * costs.weights_cpu_s
                + costs.tick_cpu_s / TICK_S * max(1.0, actors / 256),
                "coordinator I/O thread (heartbeats)": 2 * actors * costs.connection_idle_cpu_s,
                "learner requests for credit": actors / wire.CREDIT_REQUEST_RENEW_S * costs.hello_cpu_s / 0.5,
                "learner NIC (weights out)": fleet.rollouts_per_s * fleet.weights_bytes / fleet.ranks / NIC_BYTES_PER_S,
                "actor host NIC (weights in)": fleet.rollouts_per_s
                * fleet.weights_bytes
                * min(1.0, fleet.actors_per_host / actors)
                / NIC_BYTES_PER_S,
            }
            before = {
                "coordinator thread": 4 * actors * costs.report_wall_s
                + fleet.updates_per_s * costs.weights_cpu_s
                + costs.tick_cpu_s / TICK_S * max(1.0, actors / 256),
                "coordinator broadcast (CPU)": broadcast / 1e6 * costs.broadcast_cpu_s_per_mb,
                "coordinator NIC (broadcast)": broadcast / NIC_BYTES_PER_S,
            }
            rows.append(
                {
                    "fleet": fleet.name,
                    "actors": actors,
                    "report_interval_s": interval,
                    "coordinator_reports_per_s": reports,
                    "coordinator_connections": 2 * actors + 3 * fleet.ranks,
                    "coordinator_rss_mb": 70 + 2 * actors * costs.connection_kb / 1024,
                    "redis_evals_per_s": reports,
                    "redis_mb": actors * costs.redis_bytes_per_actor / 1e6,
                    "learner_hellos_per_s": actors / wire.CREDIT_REQUEST_RENEW_S,
                    "learner_weights_mb_per_s": fleet.rollouts_per_s * fleet.weights_bytes / fleet.ranks / 1e6,
                    "broadcast_before_mb_per_s": broadcast / 1e6,
                    "load": load,
                    "first": max(load, key=load.__getitem__),
                    "first_before": max({**load, **before}, key={**load, **before}.__getitem__),
                }
            )
    return rows
