"""A learner rank: pull rollouts → agree with the other ranks → one update of every member → publish.

register (Hello → Assign) → join the torch.distributed world → loop:
    receive rollouts (poll with a timeout) and grant credits (flow control, members.py)
    rank 0: read the broadcast (stop; PBT decisions)
    agree: is every rank ready? does any rank stop? has rank 0 a decision to hand out?
    apply the decision on every rank; update all members at once; rank 0 publishes weights
    report progress to the coordinator
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from rlmq.common import failpoints, transport, wire
from rlmq.common.architecture import member_activation
from rlmq.common.config import LearnerConfig, RunConfig
from rlmq.common.metrics import LearnerMetrics, serve
from rlmq.common.schema import ROLLOUT_DTYPES, core_state_problem, layout_problem
from rlmq.common.security import check_sender, counting_refusals, peer_of
from rlmq.common.service import (
    EXIT_DISK,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_WORLD_LOST,
    RateTimer,
    RejectLog,
    StopFlag,
    announce,
    keep_freed_memory,
    signals_end_at_once,
)
from rlmq.learners import checkpoint, decisions, distributed, reach
from rlmq.learners.credit_messages import CreditMessages
from rlmq.learners.credits import CreditTimeouts
from rlmq.learners.deliveries import Deliveries
from rlmq.learners.heartbeat import HeartbeatThread
from rlmq.learners.members import MemberQueues, Taken
from rlmq.learners.pbt_state import PbtState
from rlmq.learners.progress import Progress
from rlmq.learners.sockets import LearnerSockets
from rlmq.learners.trainers import Trainer, make_trainer

log = logging.getLogger("rlmq.learner")
MAX_MESSAGES_PER_RECEIVE = 256


class Learner:
    def __init__(self, cfg: LearnerConfig, stop: StopFlag) -> None:
        self.cfg, self.stop = cfg, stop
        self.metrics = LearnerMetrics()
        self.metrics_port = serve(self.metrics.registry, cfg.metrics_port, cfg.bind_host)
        announce(cfg.announce_file, metrics_port=self.metrics_port)
        self.name = f"learner-{cfg.rank}"
        self.sockets = LearnerSockets(cfg, self.name, counting_refusals(self.metrics.rejected.labels("auth").inc))
        self.heartbeat = HeartbeatThread(
            self.sockets.ctx,
            cfg.coordinator,
            self.sockets.identity + b"-beat",
            self.name,
            cfg.rank,
            self.sockets.credentials,
        )
        self.progress = Progress(self.name, cfg.rank, self.metrics)
        self.log_reject = RejectLog(log)
        self.credit_messages = CreditMessages(lambda member: wire.encode(self.weights(member)))
        self.checkpoint_number = 0  # the last checkpoint this world wrote or resumed from
        self.deliveries = Deliveries()  # a secure run checks actors' reports against these

    # --- receiving ----------------------------------------------------------------------------

    def receive(self, timeout_ms: int) -> None:
        """Take what actors sent (rollouts, hellos); hand out the credits due before waiting (or
        the wait is for data nobody may send) and again after."""
        self.members.grant(self.send_credit)
        if timeout_ms:
            self.sockets.experience.poll(timeout_ms, zmq.POLLIN)  # the one wait: then only what is there
        for _ in range(MAX_MESSAGES_PER_RECEIVE):  # bounded: a flood cannot starve the agreement
            parts = transport.receive(self.sockets.experience)
            if parts is None:
                break
            try:
                if len(parts) != 2:
                    raise wire.WireError("garbage", f"{len(parts) - 1} parts after the identity")
                actor, message = parts[0].bytes, wire.decode(parts[1].buffer)
                if self.sockets.secure:  # a secure run: only actors, each as itself
                    check_sender(parts[1], message)
                if isinstance(message, wire.Hello):
                    peer = peer_of(parts[1]) if self.sockets.secure else None
                    self.members.hello(actor, message.member, message.name, "" if peer is None else peer.user_id)
                    continue
                if not isinstance(message, wire.Rollout):
                    raise wire.WireError("unexpected_kind", type(message).__name__)
                self.members.spend(actor, message.member)
                self.check_rollout(message)
                if self.sockets.secure:
                    self.deliveries.add(message)
                if self.run_config.signs_rewards:  # the actors counted the real returns; training takes signs
                    message = dataclasses.replace(message, rewards=np.sign(message.rewards))
                self.members.enqueue(message)
                self.metrics.received.inc(message.num_steps)
            except wire.WireError as exc:
                self.reject(exc, len(parts[-1]), parts[0].bytes)
        self.members.drained()
        self.members.grant(self.send_credit)
        self.metrics.queue_depth.set(self.members.queued)

    def send_credit(self, actor: bytes, member: int) -> None:
        """A credit names our policy version; the weights of that version go just ahead of it."""
        messages = self.credit_messages.for_credit(actor, member, self.members.versions[member])
        for encoded in messages:
            self.sockets.experience.send_multipart([actor, encoded])
        if len(messages) > 1:
            self.metrics.weights_sent.inc(len(messages[0]))

    def weights(self, member: int, final: bool = False) -> wire.Weights:
        return wire.Weights(
            member=member,
            version=self.members.versions[member],
            params=self.trainer.member_params(member),
            final=final,
            trained_steps=self.trainer.trained_steps(member),
            copied_by=self.pbt.copied_by[member],
            activation=member_activation(self.pbt.hyperparams[member]),
        )

    def encoded_weights(self, member: int) -> bytes:
        return self.credit_messages.encoded_weights(member, self.members.versions[member])

    def check_rollout(self, r: wire.Rollout) -> None:
        arrays = {name: getattr(r, name) for name in ROLLOUT_DTYPES}
        slots = self.run_config.num_envs
        problem = layout_problem(arrays, self.spec, self.run_config.rollout_length, slots) or core_state_problem(
            r.core_state, self.run_config.core_state_size, slots
        )
        if problem:
            raise wire.WireError(*problem)

    def reject(self, exc: wire.WireError, size: int | None = None, sender: bytes = b"") -> None:
        self.log_reject(exc.reason, str(exc), size, sender)
        self.metrics.rejected.labels(exc.reason).inc()
        self.progress.rejected()

    def read_broadcast(self) -> None:
        """Rank 0: obey a stop; keep PBT decisions until they can be applied, in id order."""
        while self.cfg.rank == 0 and self.sockets.directives.poll(0, zmq.POLLIN):
            parts = self.sockets.directives.recv_multipart()
            try:
                if len(parts) != 2:
                    raise wire.WireError("garbage", f"{len(parts)} parts on the broadcast")
                message = wire.decode(parts[1])
                if isinstance(message, (wire.Decision, wire.Generation, wire.DiversityWeight)):
                    self.pbt.keep(message, parts[1])
            except wire.WireError as exc:
                self.reject(exc)
                continue
            if isinstance(message, wire.Directive) and message.kind == "stop":
                log.info("coordinator says stop: %s", message.reason)
                self.stop.set("directive")

    # --- the run ------------------------------------------------------------------------------

    def run(self, max_updates: int | None = None) -> int:
        hello = wire.Hello(
            role="learner",
            name=self.name,
            pid=os.getpid(),
            rank=self.cfg.rank,
            experience_endpoint=self.sockets.endpoint,
            metrics_port=self.metrics_port,
        )
        assign = reach.register(self.sockets.control, hello, self.cfg.master_addr, self.stop, self.reject)
        if assign is None:
            return EXIT_OK
        self.run_config: RunConfig = assign.config
        self.spec = assign.env_spec
        population = self.run_config.population
        batching = self.run_config.batching  # what the registry says of the algorithm
        timeouts = CreditTimeouts(wire.CREDIT_REQUEST_TTL_S, self.cfg.credit_timeout_min_s, self.cfg.credit_timeout_s)
        self.members = MemberQueues(
            population,
            self.run_config.rollouts_in_flight,
            timeouts,
            batching.rollouts_per_batch,
            2**62 if batching.max_policy_lag is None else batching.max_policy_lag,
            self.run_config.batch_wait_s,
            self.run_config.rank_wait_s,
            batching.max_rollouts_per_batch,
        )
        base = self.run_config.base_hyperparams()
        self.pbt = PbtState(
            [dict(h) for h in assign.hyperparams] or [dict(base) for _ in range(population)], assign.applied_decision
        )
        for weights in assign.member_weights:
            self.members.versions[weights.member] = weights.version
        torch.manual_seed(self.run_config.seed)
        self.heartbeat.start()
        self.heartbeat.enter()  # the rendezvous waits for every rank
        master = reach.master_address(self.cfg.master_addr, self.cfg.rank, self.sockets.reached_at, assign)
        reached = self.cfg.rank == 0 or reach.await_master(master, self.cfg.master_port, self.stop)
        if not reached or self.stop.is_set():
            return EXIT_OK
        with signals_end_at_once():  # a signal cannot reach Python inside torch's rendezvous
            if self.stop.is_set():  # one came just before
                return EXIT_OK
            device = distributed.init_world(
                self.cfg.rank,
                self.cfg.world_size,
                master,
                self.cfg.master_port,
                self.cfg.device,
                self.cfg.bind_host,
                self.cfg.collective_timeout_s,
                self.cfg.master_fd,
                self.sockets.reached_at,
            )
        self.adopt_rank0_state(device)
        log.info(
            "rank %d/%d up on %s, %s, %d member(s), experience at %s",
            self.cfg.rank,
            self.cfg.world_size,
            device,
            self.run_config.algo,
            population,
            self.sockets.endpoint,
        )
        try:
            self.trainer: Trainer = make_trainer(
                self.spec, self.run_config, assign.member_weights, self.cfg.rank, self.cfg.world_size, device
            )
            self.trainer.set_hyperparams(self.pbt.hyperparams)
            self.checkpoints = (
                checkpoint.Checkpoints(Path(self.cfg.checkpoint_dir), self.cfg.rank, self.run_config.checkpoints_kept)
                if self.cfg.checkpoint_dir
                else None
            )
            self.resume(device)
            self.heartbeat.leave()  # DDP's and the replicas' first broadcasts are behind us too
            code = self.train(device, max_updates)
            # DDP's reducer holds the process group: released here, the group goes with the world
            # rather than at interpreter exit, where a rank aborted once in ~15 runs of
            # tests/test_learner_restart.py ("terminate called without an active exception").
            del self.trainer
            distributed.shutdown(together=True)
            return code
        finally:
            distributed.shutdown()  # after a failure: at once (no-op after a clean stop)

    def adopt_rank0_state(self, device: torch.device) -> None:
        """Every rank takes rank 0's PBT state: each got its own Assign, and a decision applied
        between two of them would leave the ranks training different hyperparameters (DDP makes
        only the parameters equal)."""
        state = {"pbt": self.pbt.to_json(), "versions": self.members.versions}
        shared = json.loads(distributed.share_any_length(json.dumps(state).encode(), device))  # never pickle
        self.pbt, self.members.versions = PbtState.from_json(shared["pbt"]), shared["versions"]

    # --- checkpoints ----------------------------------------------------------------------------

    def resume(self, device: torch.device) -> None:
        """Carry on from the newest checkpoint every rank holds, if there is one: the trainer's
        whole state, the policy versions and the PBT state it was written with. The coordinator sends
        the decisions applied since again (this world reports the older count), and they are applied
        again, in order, to the state they were first applied to."""
        found, newest = checkpoint.newest_everywhere(self.checkpoints, device)
        self.checkpoint_number = max(newest, 0)
        if found < 0:
            return
        assert self.checkpoints is not None
        state = self.checkpoints.load(found)
        checkpoint.restore(self.trainer, state["trainer"], "trainer")
        saved = state["learner"]
        # A version must name one set of weights: past what the coordinator holds if it is newer.
        self.members.versions = [
            v if v >= published else published + 1
            for v, published in zip(saved["versions"], self.members.versions, strict=True)
        ]
        self.pbt = PbtState.from_json(saved)
        self.trainer.set_hyperparams(self.pbt.hyperparams)
        log.info(
            "rank %d resumed from checkpoint %d (%s): versions %s, PBT decisions applied %d",
            self.cfg.rank,
            found,
            self.checkpoints.path(found),
            self.members.versions,
            self.pbt.applied,
        )

    def save_checkpoint(self, device: torch.device) -> None:
        self.checkpoint_number += 1
        started = time.perf_counter()
        if checkpoint.write_everywhere(self.checkpoints, self.checkpoint_number, self.checkpoint_state(), device):
            self.metrics.checkpoint_seconds.observe(time.perf_counter() - started)
            log.info("checkpoint %d written in %.2f s", self.checkpoint_number, time.perf_counter() - started)

    def checkpoint_state(self) -> dict[str, Any]:
        return checkpoint.record(
            self.trainer,
            self.members.versions,
            self.pbt.to_json(),
            self.cfg.rank,
            self.cfg.world_size,
            self.run_config,
            self.spec,
            self.pbt.hyperparams,
        )

    # --- training -------------------------------------------------------------------------------

    def train(self, device: torch.device, max_updates: int | None) -> int:
        population = self.run_config.population
        checkpoint_due = RateTimer(self.run_config.checkpoint_interval_s or float("inf"))
        if self.cfg.rank == 0:
            for member in range(population):
                self.publish(member)
        report = RateTimer(self.run_config.report_interval_s)
        updates_done = 0
        while True:
            self.metrics.heartbeat.beat()
            self.receive(timeout_ms=0 if self.members.ready() else 10)
            self.read_broadcast()
            self.progress.dropped_stale(self.members.drop_stale())
            limit_hit = max_updates is not None and updates_done >= max_updates
            self.heartbeat.enter()
            owed = self.trainer.owes_steps()  # the same on every rank: those steps first, no new data
            agreed = self.agree(
                device,
                self.stop.is_set() or limit_hit,
                self.checkpoints is not None and self.cfg.rank == 0 and checkpoint_due.due(),
                owed,
            )
            if agreed.stop:
                self.heartbeat.leave()
                break
            if agreed.checkpoint:
                self.save_checkpoint(device)
            if agreed.update:
                updated = self.update(agreed, owed)
                self.heartbeat.leave()  # the update's collectives are behind us: what follows is local
                self.publish_updated(updated)
                updates_done += 1
            else:
                self.heartbeat.leave()
            if report.due():
                self.report()
        self.report(final=True)  # ahead of the final weights: the coordinator may stop reading on those
        if self.cfg.rank == 0:
            for member in range(population):  # the last one says final: the coordinator has them all
                self.publish(member, final=member == population - 1)
        # The state a resumed run carries on from, after the final weights: the coordinator waits for
        # those, and a large replay's write would hold up the run's end (its final evaluation) for nothing.
        self.heartbeat.enter()
        self.save_checkpoint(device)
        self.heartbeat.leave()
        return EXIT_OK

    def agree(self, device: torch.device, stop: bool, checkpoint_due: bool, owed: bool) -> distributed.Agreement:
        """What every rank does this iteration, the same on all (update? stop? checkpoint?), with
        rank 0's next PBT decision applied everywhere first. `owed`: the update pays steps owed
        (`Trainer.owes_steps`) and takes no new data."""
        offer = self.pbt.offer()
        agreed = self.trainer.agree(
            distributed.proposal(
                owed or self.members.ready(),
                not owed and self.members.overdue(),
                stop,
                [0] * self.run_config.population if owed else self.members.batch_samples(),
                len(offer),
                checkpoint_due,
                max(([] if owed else self.members.batch_sizes()) + [self.members.need]),
                device,
            ),
            self.members.peek,
        )
        if agreed.decision_bytes:
            applied = self.apply_decision(wire.decode(distributed.share(offer, agreed.decision_bytes, device)))
            if applied.drops_queued:  # the member's queued batch, another policy's, is gone on every rank
                for member in applied.replaced:
                    agreed.member_samples[member] = 0
        return agreed

    def update(self, agreed: distributed.Agreement, owed: bool) -> list[int]:
        """One update of every member with a batch (or the steps `owed`, on no new data), on every
        rank in step: the members updated."""
        taken = Taken([[] for _ in self.members.queues], []) if owed else self.members.take()
        if self.checkpoint_number > 0:
            failpoints.reach(self.cfg.failpoint, failpoints.LEARNER_IN_UPDATE, "in the update after a checkpoint")
        started = time.perf_counter()
        losses, updated = self.trainer.train(taken.rollouts, agreed.member_samples, agreed.batch_rollouts)
        self.progress.updated(taken, losses, time.perf_counter() - started)
        return updated

    def publish_updated(self, updated: list[int]) -> None:
        """The updated members' versions move on, and rank 0 publishes their weights every
        `publish_every` versions."""
        for member in updated:
            self.members.versions[member] += 1
            if self.cfg.rank == 0 and self.members.versions[member] % self.run_config.algo_config.publish_every == 0:
                self.publish(member)

    def apply_decision(self, decision: wire.Message) -> decisions.Applied:
        """A population decision on every rank at the same iteration (decisions.py); the members
        it gave other weights get new versions (and lose their queued data where it is another
        policy's), and rank 0 publishes them at once."""
        applied = decisions.apply(decision, self.pbt, self.trainer)
        for member in applied.replaced:
            if applied.drops_queued:
                self.members.replaced(member)
            else:
                self.members.versions[member] += 1
        if self.cfg.rank == 0:
            for member in applied.replaced:
                self.publish(member)
            self.report()
        return applied

    def publish(self, member: int, final: bool = False) -> None:
        """Rank 0: the member's weights to the coordinator (Redis: Assigns, the evaluator, restarts)."""
        transport.send_encoded(
            self.sockets.control, wire.encode(self.weights(member, final)) if final else self.encoded_weights(member)
        )

    def report(self, final: bool = False) -> None:
        # The skipped steps are read here, not per update: on a GPU reading the count waits for the device.
        self.progress.nonfinite(self.trainer.nonfinite_skipped())
        report = self.progress.report(self.members, self.deliveries, self.pbt.applied, final)
        transport.send(self.sockets.control, report)

    def close(self) -> None:
        self.heartbeat.close()
        self.sockets.close()


def main(cfg: LearnerConfig, stop: StopFlag, max_updates: int | None = None) -> int:
    torch.set_num_threads(cfg.torch_threads)
    keep_freed_memory()
    learner = Learner(cfg, stop)
    try:
        return learner.run(max_updates)
    except checkpoint.DiskRefused as exc:  # a restarted world would meet the same disk
        log.error("learner rank %d %s", cfg.rank, exc)
        return EXIT_DISK
    except Exception as exc:
        if cfg.world_size > 1 and distributed.lost_world(exc):
            log.error(
                "learner rank %d lost its world; exit %d (`rlmq learner --restart` joins a new one)",
                cfg.rank,
                EXIT_WORLD_LOST,
                exc_info=True,
            )
            return EXIT_WORLD_LOST
        log.exception("learner rank %d failed", cfg.rank)
        return EXIT_FAILED
    finally:
        learner.close()
