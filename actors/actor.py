"""An actor: stateless. Register → step the env → push rollouts → pick up new weights.

    Hello → Assign (member, env, learner endpoints, current weights)
    loop until stopped or `max_steps`:
        wait for a credit from some learner (flow control: the learners pace the actors); the
            weights it names come just ahead of it, unless we hold them (a stop directive ends the wait)
        collect one rollout with them, tagged with their version; send it to that learner
        report env steps and finished episodes every `report_interval_s`

Killed and restarted, it says Hello again and carries on: nothing it holds needs saving. While the
coordinator is away its reports carry on too: each holds the actor's totals and the returns not yet
acknowledged, and the coordinator counts what the totals add, so no env step goes uncounted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import numpy as np
import zmq

from rlmq.actors.collector import Collector
from rlmq.actors.held_policy import HeldPolicy, Source
from rlmq.actors.reports import Reports
from rlmq.common import envs, transport, wire
from rlmq.common.config import ActorConfig
from rlmq.common.contact import Contact
from rlmq.common.metrics import ActorMetrics, serve
from rlmq.common.models import acting_device
from rlmq.common.security import Credentials
from rlmq.common.service import EXIT_FAILED, EXIT_OK, EXIT_USAGE, RateTimer, RejectLog, StopFlag, announce, cores_given

log = logging.getLogger("rlmq.actor")
WEIGHTS_PULL_S = 1.0  # holding a credit but no weights that fit, ask the coordinator for them this often


class Actor:
    def __init__(self, cfg: ActorConfig, stop: StopFlag) -> None:
        self.cfg, self.stop = cfg, stop
        self.metrics = ActorMetrics()
        self.metrics_port = serve(self.metrics.registry, cfg.metrics_port, cfg.bind_host)
        announce(cfg.announce_file, metrics_port=self.metrics_port)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.credentials = Credentials.load(cfg.keys_dir, cfg.key_name or cfg.name, serves=False)
        self.control = transport.make_socket(self.ctx, zmq.DEALER, identity=f"{cfg.name}-{os.getpid()}".encode())
        self.credentials.client(self.control)
        self.contacts = [Contact(self.control, f"the coordinator at {cfg.coordinator}", log)]
        self.control.connect(cfg.coordinator)
        self.learners: list[zmq.Socket] = []  # one DEALER per learner rank
        self.credits: list[int] = []
        self.broadcast = transport.make_socket(self.ctx, zmq.SUB)
        self.credentials.client(self.broadcast)
        self.rejected = 0
        self.log_reject = RejectLog(log)

    def reject(self, exc: wire.WireError) -> None:
        self.log_reject(exc.reason, str(exc))
        self.metrics.rejected.labels(exc.reason).inc()
        self.rejected += 1

    def run(self) -> int:
        hello = wire.Hello(role="actor", name=self.cfg.name, pid=os.getpid(), metrics_port=self.metrics_port)
        assign = transport.request_assignment(self.control, hello, self.stop, on_reject=self.reject)
        if assign is None:
            return EXIT_OK
        self.member, run_config, spec = assign.member, assign.config, assign.env_spec
        self.reports = Reports(self.cfg.name, self.member, self.metrics, run_config.report_interval_s)
        for endpoint in assign.learner_endpoints:
            sock = transport.make_socket(self.ctx, zmq.DEALER, hwm=1000)
            self.credentials.client(sock)
            self.contacts.append(Contact(sock, f"the learner at {endpoint}", log))
            sock.connect(endpoint)
            self.learners.append(sock)
            self.credits.append(0)
        self.encoded_hello = wire.encode(dataclasses.replace(hello, member=self.member))  # to learners
        self.asked_at = [0.0] * len(self.learners)  # when we last asked each learner for credit
        self.poller = zmq.Poller()
        for sock in self.learners:
            self.poller.register(sock, zmq.POLLIN)
        self.greet_learners()
        self.broadcast.setsockopt(zmq.SUBSCRIBE, wire.DIRECTIVE_TOPIC)
        self.broadcast.connect(self.cfg.broadcast)
        try:
            device = acting_device(self.cfg.device, run_config.encoder_for(spec), assign.actor_index)
        except ValueError as exc:  # a GPU asked for and not there
            log.error("%s", exc)
            return EXIT_USAGE
        self.held = HeldPolicy(run_config, spec, self.member, device)
        if assign.weights is not None:
            self.take_weights(assign.weights, "assign")
        threads = self.cfg.env_threads or cores_given()
        # Two lanes where the emulators have a core of their own while the policy acts (a GPU acts,
        # or a second core): on one core they would only take turns with it (benchmarks/LOG.md §15).
        split = device is not None or threads >= 2
        lanes = envs.make_lanes(run_config.env_id, run_config.num_envs, threads, split, run_config.frame_stack)
        seed = run_config.seed * 100_003 + assign.actor_index * 1_009
        collector = Collector(lanes, spec, run_config.rollout_length, seed)
        log.info(
            "%s: member %d, %s × %d in %d lane(s), acting on %s, learners %s",
            self.cfg.name,
            self.member,
            run_config.env_id,
            run_config.num_envs,
            len(lanes),
            device or "the CPU",
            ", ".join(assign.learner_endpoints),
        )
        starving = RateTimer(WEIGHTS_PULL_S)
        steps_total = 0
        try:
            while not self.stop.is_set():
                self.read_broadcast()
                learner = self.wait_for_credit(collector)
                if learner is None:
                    break
                if self.held.policy is None:  # the weights that came with the credit did not fit
                    self.pull_weights(hello, starving)
                    continue
                started_at = time.time()
                rollout = collector.collect(
                    self.held.policy, self.member, self.held.version, self.cfg.name, self.held.copied_by
                )
                self.learners[learner].send(wire.encode(rollout))
                self.credits[learner] -= 1
                self.asked_at[learner] = time.monotonic()  # a delivered rollout asks for the next credit
                steps = int(np.count_nonzero(rollout.valid))
                self.reports.collected(steps, started_at)
                steps_total += steps
                if self.reports.due():
                    self.report(collector)
                if self.cfg.max_steps is not None and steps_total >= self.cfg.max_steps:
                    break
            self.report(collector)
            self.flush_reports()
        finally:
            collector.close()
        return EXIT_OK

    def greet_learners(self) -> None:
        """Ask every learner we hold no credit from for one, again every CREDIT_REQUEST_RENEW_S
        while we wait: a learner forgets requests that are not renewed (so that dead actors lose
        their place), and one that restarted has forgotten us altogether."""
        now = time.monotonic()
        for i, sock in enumerate(self.learners):
            if self.credits[i] == 0 and now - self.asked_at[i] >= wire.CREDIT_REQUEST_RENEW_S:
                try:
                    sock.send(self.encoded_hello, flags=zmq.NOBLOCK)
                except zmq.Again:  # not connected yet: the next renewal tries again
                    continue
                self.asked_at[i] = now

    def wait_for_credit(self, collector: Collector) -> int | None:
        """Index of a learner whose credit we hold (waiting as long as it takes), or None on stop.

        While waiting: read the broadcast (a stop must get through), keep reporting, and renew our
        requests for credit. The weights a credit names come just ahead of it, on the same
        connection, unless that learner sent us them before: so they are ours when it is.
        """
        started = time.perf_counter()
        while not self.stop.is_set():
            for i, sock in enumerate(self.learners):
                while transport.readable(sock):
                    try:
                        message = wire.decode(sock.recv())
                        if isinstance(message, wire.Weights):  # they come just ahead of a credit
                            self.take_weights(message, "learner")
                            continue
                        if not isinstance(message, wire.Credit):
                            raise wire.WireError("unexpected_kind", type(message).__name__)
                    except wire.WireError as exc:
                        self.reject(exc)
                        continue
                    self.credits[i] += message.count
            best = max(range(len(self.credits)), key=self.credits.__getitem__)
            if self.credits[best] > 0:
                self.reports.waited_for_credit(time.perf_counter() - started)
                return best
            self.greet_learners()
            self.poller.poll(50)
            self.read_broadcast()
            if self.reports.due():
                self.report(collector)
        return None

    def pull_weights(self, hello: wire.Hello, starving: RateTimer) -> None:
        """Holding a credit but no weights (those that came with it were refused, and counted), ask
        the coordinator now and then: its Assign carries the latest it holds."""
        if starving.due():
            transport.send(self.control, hello)
        self.control.poll(100, zmq.POLLIN)
        self.read_control()

    def read_control(self) -> None:
        """What the coordinator sent us: acknowledgements of our reports, and Assigns (answers to a
        repeated Hello), whose weights we take while we have none."""
        while self.control.poll(0, zmq.POLLIN):
            try:
                message = wire.decode(self.control.recv())
            except wire.WireError as exc:
                self.reject(exc)
                continue
            if isinstance(message, wire.ReportAck):
                self.reports.acknowledged(message)
            elif isinstance(message, wire.Assign) and message.member == self.member and message.weights is not None:
                self.take_weights(message.weights, "assign")

    def read_broadcast(self) -> None:
        """Obey a stop. Every loop of the actor passes here, waiting for credit included: it is
        where the actor's heartbeat beats and where it notices losing and regaining contact with
        its peers."""
        self.metrics.heartbeat.beat()
        for contact in self.contacts:
            contact.check()
        while transport.readable(self.broadcast):
            try:
                _topic, encoded = self.broadcast.recv_multipart()
                message = wire.decode(encoded)
            except (ValueError, wire.WireError) as exc:  # ValueError: not two parts
                self.reject(exc if isinstance(exc, wire.WireError) else wire.WireError("garbage", str(exc)))
                continue
            if isinstance(message, wire.Directive) and message.kind == "stop":
                self.stop.set("directive")

    def take_weights(self, weights: wire.Weights, source: Source) -> None:
        """Offer weights to the held policy (`HeldPolicy.offer` says which it takes); a refusal
        for cause is counted as a rejected message."""
        try:
            adopted = self.held.offer(weights, source)
        except wire.WireError as exc:
            self.reject(exc)
            return
        if adopted:
            self.metrics.policy_version.set(self.held.version)

    def report(self, collector: Collector) -> None:
        """Tell the coordinator what was collected since the last report (actors/reports.py)."""
        returns, lengths, lineages = collector.finished_episodes()
        encoded = self.reports.next(
            returns, lengths, lineages, *collector.take_times(), self.held.version, self.rejected
        )
        self.rejected = 0
        transport.send_encoded(self.control, encoded)
        self.read_control()

    def flush_reports(self) -> None:
        """Wait (bounded: Reports.last_word) for the coordinator to acknowledge our last report and
        count all of it, sending it again now and then: the coordinator may be away, and a secure
        run counts our last rollouts only once the learners have reported taking them. It counts
        each step once however often the report comes."""
        wait_s, resend_s = self.reports.last_word()
        deadline, resend = time.monotonic() + wait_s, RateTimer(resend_s)
        while not self.reports.settled and time.monotonic() < deadline:
            if resend.due():
                transport.send_encoded(self.control, self.reports.last)
            self.control.poll(50, zmq.POLLIN)
            self.read_control()

    def close(self) -> None:
        for contact in self.contacts:
            contact.close()
        for sock in (self.control, self.broadcast, *self.learners):
            sock.close()


def main(cfg: ActorConfig, stop: StopFlag) -> int:
    actor = Actor(cfg, stop)
    try:
        return actor.run()
    except envs.EnvError as exc:
        log.error("%s", exc)
        return EXIT_FAILED
    finally:
        actor.close()
