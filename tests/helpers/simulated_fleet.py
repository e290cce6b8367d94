"""Many actors in one process (issue 45): identities that speak the actors' protocol, for measuring
what a large fleet costs the coordinator, Redis and the learners on one machine.

Each identity is an actor as the services see it: a name of its own, its own sockets (a DEALER to
the coordinator's control socket, a SUB to its broadcast, a DEALER to each learner rank), each on
CURVE with the fleet's key. It says Hello and takes its Assign, renews its requests for credit
every CREDIT_REQUEST_RENEW_S, sends a rollout on each credit, reports its totals every
`report_interval_s` and takes the acknowledgements, reads the broadcast, and stops on the
coordinator's stop. What it does not do is run a process of its own: one thread polls every
identity's sockets. An identity steps its envs only while it holds a credit, and the learners
hand out credits at the rate they train, so the fleet's env steps are what one learner asks for
however many identities there are: real CartPole episodes under the weights the identity holds
(`actors/collector.py`, `actors/held_policy.py` and `actors/reports.py`, the actor's own parts),
so that a run with a simulated fleet trains and ends as a real one does.

    python -m tests.helpers.simulated_fleet --keys K --coordinator C --broadcast B \\
        --identities 1024 --stats stats.jsonl

`--stats`: a JSON line every STATS_EVERY_S of the fleet's counts so far (messages and bytes each
way, acknowledgement delays), which benchmarks/bench_fleet.py turns into rates.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq

from rlmq.actors.collector import Collector
from rlmq.actors.held_policy import HeldPolicy
from rlmq.actors.reports import Reports
from rlmq.common import envs, security, transport, wire
from rlmq.common.metrics import ActorMetrics
from rlmq.common.service import open_files_as_allowed

ASSIGN_RESEND_S = 2.0  # transport.request_assignment's
WEIGHTS_PULL_S = 1.0  # actors.actor's: without weights this long, say Hello to the coordinator again
TICK_S = 0.02  # how often every identity's timers are looked at
STATS_EVERY_S = 1.0
NO_RETURNS = (np.zeros(0, np.float64), np.zeros(0, np.int64), np.zeros(0, np.int64))


@dataclasses.dataclass
class Counts:
    """What the whole fleet sent and received so far."""

    assigned: int = 0
    reports: int = 0
    report_bytes: int = 0
    acks: int = 0
    ack_delay_s: float = 0.0  # summed over the acks, from the report they answer
    ack_delay_max_s: float = 0.0
    broadcast_weights: int = 0
    broadcast_bytes: int = 0  # every message on the broadcast
    learner_weights: int = 0
    learner_weights_bytes: int = 0
    credits: int = 0
    credit_requests: int = 0
    rollouts: int = 0
    rollout_bytes: int = 0
    env_steps: int = 0
    episodes: int = 0
    rejected: int = 0


class Identity:
    """One simulated actor: `actors/actor.py`'s protocol, driven by the fleet's poll loop."""

    def __init__(self, fleet: SimulatedFleet, index: int) -> None:
        self.fleet, self.name = fleet, f"sim-{index}"
        self.hello = wire.Hello(role="actor", name=self.name, pid=os.getpid())
        self.control = fleet.socket(zmq.DEALER, self, "control", identity=f"{self.name}-{os.getpid()}".encode())
        self.control.connect(fleet.coordinator)
        self.learners: list[zmq.Socket] = []
        self.broadcast: zmq.Socket | None = None
        self.member = -1
        self.held: HeldPolicy | None = None
        self.reports: Reports | None = None
        self.collector: Collector | None = None
        self.credits: list[int] = []
        self.asked_at: list[float] = []
        self.encoded_hello = b""
        self.said_hello_at = -float("inf")
        # steps_total → when the newest report of it went (an idle identity's reports repeat their
        # totals, so an ack's delay is counted from the newest: a lower bound)
        self.report_sent_at: dict[int, float] = {}
        self.actor_index = index

    # --- what comes in --------------------------------------------------------------------------

    def on_control(self, encoded: bytes) -> None:
        message = wire.decode(encoded)
        if isinstance(message, wire.Assign):
            if self.held is None:
                self.assigned(message)
            elif message.weights is not None:
                self.held.offer(message.weights, "assign")
        elif isinstance(message, wire.ReportAck) and self.reports is not None:
            self.reports.acknowledged(message)
            sent = self.report_sent_at.pop(message.steps_total, None)
            if sent is not None:
                delay = time.monotonic() - sent
                counts = self.fleet.counts
                counts.acks += 1
                counts.ack_delay_s += delay
                counts.ack_delay_max_s = max(counts.ack_delay_max_s, delay)
            for steps in [s for s in self.report_sent_at if s < message.steps_total]:
                del self.report_sent_at[steps]  # answered by a later report's ack

    def on_learner(self, index: int, encoded: bytes) -> None:
        message = wire.decode(encoded)
        counts = self.fleet.counts
        if isinstance(message, wire.Weights):
            assert self.held is not None
            self.held.offer(message, "learner")
            counts.learner_weights += 1
            counts.learner_weights_bytes += len(encoded)
        elif isinstance(message, wire.Credit):
            self.credits[index] += message.count
            counts.credits += message.count
            self.fleet.holding.add(self)
        else:
            raise wire.WireError("unexpected_kind", type(message).__name__)

    def on_broadcast(self, parts: list[bytes]) -> None:
        if len(parts) != 2:
            raise wire.WireError("garbage", f"{len(parts)} parts on the broadcast")
        message = wire.decode(parts[1])
        self.fleet.counts.broadcast_bytes += len(parts[1])
        if isinstance(message, wire.Directive) and message.kind == "stop":
            self.fleet.stopping = True
        elif isinstance(message, wire.Weights):  # none since weights go only with credits (issue 45)
            self.fleet.counts.broadcast_weights += 1

    def assigned(self, assign: wire.Assign) -> None:
        fleet = self.fleet
        self.member, self.run_config, self.spec = assign.member, assign.config, assign.env_spec
        self.actor_index = assign.actor_index
        self.held = HeldPolicy(assign.config, assign.env_spec, assign.member)
        if assign.weights is not None:
            self.held.offer(assign.weights, "assign")
        self.reports = Reports(self.name, self.member, fleet.metrics, assign.config.report_interval_s)
        self.encoded_hello = wire.encode(dataclasses.replace(self.hello, member=self.member))
        for i, endpoint in enumerate(assign.learner_endpoints):
            sock = fleet.socket(zmq.DEALER, self, f"learner:{i}", hwm=1000)
            sock.connect(endpoint)
            self.learners.append(sock)
        self.credits = [0] * len(self.learners)
        self.asked_at = [-float("inf")] * len(self.learners)
        self.broadcast = fleet.socket(zmq.SUB, self, "broadcast")
        self.broadcast.setsockopt(zmq.SUBSCRIBE, wire.DIRECTIVE_TOPIC)
        self.broadcast.connect(fleet.broadcast)
        fleet.counts.assigned += 1

    # --- what goes out ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The timers: Hello until assigned (and while without weights), requests for credit,
        reports."""
        if self.held is None or self.held.policy is None:
            every = ASSIGN_RESEND_S if self.held is None else WEIGHTS_PULL_S
            if now - self.said_hello_at >= every:
                transport.send(self.control, self.hello)
                self.said_hello_at = now
            return
        for i, sock in enumerate(self.learners):
            if self.credits[i] == 0 and now - self.asked_at[i] >= wire.CREDIT_REQUEST_RENEW_S:
                if transport.send_encoded(sock, self.encoded_hello):
                    self.asked_at[i] = now
                    self.fleet.counts.credit_requests += 1
        if self.reports is not None and self.reports.due():
            self.report(now)

    def collect(self) -> None:
        """One rollout on a credit we hold, with the weights we hold."""
        assert self.held is not None and self.held.policy is not None and self.reports is not None
        learner = max(range(len(self.credits)), key=self.credits.__getitem__)
        if self.collector is None:  # most identities of a large fleet seldom collect: envs on demand
            lanes = envs.make_lanes(self.run_config.env_id, self.run_config.num_envs, 1, False)
            seed = self.run_config.seed * 100_003 + self.actor_index * 1_009
            self.collector = Collector(lanes, self.spec, self.run_config.rollout_length, seed)
        started_at = time.time()
        rollout = self.collector.collect(
            self.held.policy, self.member, self.held.version, self.name, self.held.copied_by
        )
        encoded = wire.encode(rollout)
        self.learners[learner].send(encoded)
        self.credits[learner] -= 1
        self.asked_at[learner] = time.monotonic()  # a delivered rollout asks for the next credit
        steps = int(np.count_nonzero(rollout.valid))
        self.reports.collected(steps, started_at)
        counts = self.fleet.counts
        counts.rollouts += 1
        counts.rollout_bytes += len(encoded)
        counts.env_steps += steps

    def report(self, now: float) -> None:
        assert self.reports is not None and self.held is not None
        if self.collector is None:
            returns, lengths, lineages = NO_RETURNS
            times = (0.0, 0.0)
        else:
            returns, lengths, lineages = self.collector.finished_episodes()
            times = self.collector.take_times()
        encoded = self.reports.next(returns, lengths, lineages, *times, self.held.version, 0)
        transport.send_encoded(self.control, encoded)
        self.report_sent_at[self.reports.totals[0]] = now
        counts = self.fleet.counts
        counts.reports += 1
        counts.report_bytes += len(encoded)
        counts.episodes += len(returns)

    @property
    def settled(self) -> bool:
        return self.reports is None or self.reports.settled

    def close(self) -> None:
        if self.collector is not None:
            self.collector.close()


class SimulatedFleet:
    def __init__(self, keys_dir: Path, coordinator: str, broadcast: str, identities: int) -> None:
        self.coordinator, self.broadcast = coordinator, broadcast
        self.keys = security.load_keys(keys_dir, security.FLEET, serves=False)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 4 * identities + 64)  # a control, a broadcast and a socket per learner each
        self.metrics = ActorMetrics()  # one for the fleet: nobody scrapes it
        self.counts = Counts()
        self.poller = zmq.Poller()
        self.routes: dict[zmq.Socket, Callable[[zmq.Socket], None]] = {}
        self.holding: set[Identity] = set()  # identities that hold a credit
        self.stopping = False
        self.identities = [Identity(self, i) for i in range(identities)]

    def socket(
        self, kind: int, who: Identity, role: str, hwm: int = transport.DEFAULT_HWM, identity: bytes | None = None
    ) -> zmq.Socket:
        sock = transport.make_socket(self.ctx, kind, hwm=hwm, identity=identity)
        security.connect_securely(sock, self.keys)
        self.poller.register(sock, zmq.POLLIN)
        if role == "control":
            self.routes[sock] = lambda s: who.on_control(s.recv())
        elif role == "broadcast":
            self.routes[sock] = lambda s: who.on_broadcast(s.recv_multipart())
        else:
            index = int(role.split(":")[1])
            self.routes[sock] = lambda s: who.on_learner(index, s.recv())
        return sock

    def run(self, stop: Callable[[], bool], stats: Path | None) -> None:
        next_tick = next_stats = time.monotonic()
        while not stop() and not self.stopping:
            self.read(int(TICK_S * 1000))
            for identity in list(self.holding):
                if identity.held is not None and identity.held.policy is not None:
                    identity.collect()
                if not any(identity.credits):
                    self.holding.discard(identity)
            now = time.monotonic()
            if now >= next_tick:
                for identity in self.identities:
                    identity.tick(now)
                next_tick = now + TICK_S
            if stats is not None and now >= next_stats:
                self.write_stats(stats)
                next_stats = now + STATS_EVERY_S
        self.last_word()
        if stats is not None:
            self.write_stats(stats)

    def read(self, timeout_ms: int) -> None:
        """Every message waiting on the sockets `poll` names (after waiting at most `timeout_ms`)."""
        for sock, _event in self.poller.poll(timeout_ms):
            route = self.routes[sock]
            while transport.readable(sock):
                try:
                    route(sock)
                except wire.WireError:
                    self.counts.rejected += 1

    def last_word(self) -> None:
        """As an actor that stops: each identity's last report, sent again (bounded) until the
        coordinator counts all of it (a secure run counts the last rollouts once the learners
        say they took them)."""
        wait_s, resend_s = min(
            (identity.reports.last_word() for identity in self.identities if identity.reports is not None),
            default=(0.0, 0.0),
        )
        deadline = time.monotonic() + wait_s
        for identity in self.identities:
            if identity.reports is not None:
                identity.report(time.monotonic())
        while time.monotonic() < deadline and not all(identity.settled for identity in self.identities):
            self.read(int(resend_s * 1000))
            for identity in self.identities:
                if not identity.settled:
                    assert identity.reports is not None
                    transport.send_encoded(identity.control, identity.reports.last)

    def write_stats(self, stats: Path) -> None:
        with stats.open("a") as out:
            out.write(json.dumps({"t": time.time(), **dataclasses.asdict(self.counts)}) + "\n")

    def close(self) -> None:
        for identity in self.identities:
            identity.close()
        for sock in self.routes:
            sock.close(0)
        self.ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=Path, required=True, help="The run's keys directory (with the fleet's key).")
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--broadcast", required=True)
    parser.add_argument("--identities", type=int, required=True)
    parser.add_argument("--stats", type=Path)
    args = parser.parse_args()
    open_files_as_allowed()  # ~2 descriptors a socket
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stopping.append(signum))
    fleet = SimulatedFleet(args.keys, args.coordinator, args.broadcast, args.identities)
    try:
        fleet.run(lambda: bool(stopping), args.stats)
    finally:
        fleet.close()


if __name__ == "__main__":
    main()
