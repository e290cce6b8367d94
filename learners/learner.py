"""A learner rank: pull rollouts → agree with the other ranks → DDP update → publish weights.

    register (Hello → Assign) → join the torch.distributed world → loop:
        receive rollouts (poll with a timeout) and grant credits (flow control, credits.py)
        rank 0: read directives (stop)
        agree: does every rank have a batch? does any rank stop?
        update; rank 0 publishes weights every `publish_every` updates
        report progress to the coordinator
"""

from __future__ import annotations

import collections
import logging
import os
import time

import numpy as np
import torch
import zmq
from torch.nn.parallel import DistributedDataParallel

from rlmq.common import transport, wire
from rlmq.common.config import LearnerConfig, RunConfig
from rlmq.common.metrics import LearnerMetrics, serve
from rlmq.common.service import EXIT_FAILED, EXIT_OK, RateTimer, StopFlag
from rlmq.learners import distributed, ppo
from rlmq.learners.credits import CreditLedger
from rlmq.learners.networks import ActorCritic, load_numpy_params, to_numpy_params

log = logging.getLogger("rlmq.learner")
MAX_MESSAGES_PER_RECEIVE = 256


class Learner:
    def __init__(self, cfg: LearnerConfig, stop: StopFlag) -> None:
        self.cfg, self.stop = cfg, stop
        self.metrics = LearnerMetrics()
        self.metrics_port = serve(self.metrics.registry, cfg.metrics_port)
        self.name = f"learner-{cfg.rank}"
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.control = transport.make_socket(self.ctx, zmq.DEALER, identity=f"{self.name}-{os.getpid()}".encode())
        self.control.connect(cfg.coordinator)
        self.experience = transport.make_socket(self.ctx, zmq.ROUTER, hwm=1000)
        port = transport.bind(self.experience, f"tcp://{cfg.bind_host}:{cfg.experience_port}").rsplit(":", 1)[1]
        self.endpoint = f"tcp://{cfg.advertise_host}:{port}"
        self.directives = transport.make_socket(self.ctx, zmq.SUB)
        if cfg.rank == 0:
            self.directives.setsockopt(zmq.SUBSCRIBE, wire.DIRECTIVE_TOPIC)
            self.directives.connect(cfg.broadcast)
        self.queue: collections.deque[wire.Rollout] = collections.deque()
        self.version = 0
        self.counts = collections.Counter[str]()
        self.lags: list[int] = []

    # --- receiving ----------------------------------------------------------------------------

    def receive(self, timeout_ms: int) -> None:
        """Take what actors sent (rollouts, hellos); hand out the credits due before waiting (or
        the wait is for data nobody may send) and again after."""
        self.grant_credits()
        for _ in range(MAX_MESSAGES_PER_RECEIVE):  # bounded: a flood cannot starve the agreement
            if not self.experience.poll(timeout_ms, zmq.POLLIN):
                break
            timeout_ms = 0
            parts = self.experience.recv_multipart(copy=False)
            try:
                if len(parts) != 2:
                    raise wire.WireError("garbage", f"{len(parts) - 1} frames after the identity")
                actor, message = parts[0].bytes, wire.decode(parts[1].buffer)
                if isinstance(message, wire.Hello):
                    self.credits.hello(actor)
                    continue
                if not isinstance(message, wire.Rollout):
                    raise wire.WireError("unexpected_kind", type(message).__name__)
                if not self.credits.holds(actor):  # the budget holds only if credits are enforced
                    raise wire.WireError("no_credit", "a rollout without a credit")
                self.credits.delivered(actor)
                self.check_rollout(message)
            except wire.WireError as exc:
                self.reject(exc)
                continue
            self.queue.append(message)
        self.grant_credits()

    def grant_credits(self) -> None:
        granted = self.credits.grant(time.monotonic(), queued=len(self.queue))
        if granted:
            frame = wire.encode(wire.Credit(1, policy_version=self.version))
            for actor in granted:
                self.experience.send_multipart([actor, frame])
        self.metrics.queue_depth.set(len(self.queue))

    def check_rollout(self, r: wire.Rollout) -> None:
        spec, run_cfg = self.spec, self.run_cfg
        if r.member != 0:
            raise wire.WireError("unknown_member", f"member {r.member}")
        if r.obs.shape[:2] != (run_cfg.rollout_length + 1, run_cfg.num_envs):
            raise wire.WireError("bad_shape", f"obs {r.obs.shape}: the run's rollouts are "
                                 f"{run_cfg.rollout_length} steps × {run_cfg.num_envs} slots")
        if r.obs.shape[2:] != (spec.obs_dim,) or r.obs.dtype != np.float32:
            raise wire.WireError("bad_shape", f"obs {r.obs.shape} {r.obs.dtype}, env has {spec.obs_dim}")
        want = (np.int64, ()) if spec.action_kind == "discrete" else (np.float32, (spec.action_dim,))
        if r.actions.dtype != want[0] or r.actions.shape[2:] != want[1]:
            raise wire.WireError("bad_shape", f"actions {r.actions.shape} {r.actions.dtype}")
        if spec.action_kind == "discrete" and (r.actions.min(initial=0) < 0 or r.actions.max(initial=0) >= spec.action_dim):
            raise wire.WireError("bad_value", "action index out of range")

    def reject(self, exc: wire.WireError) -> None:
        log.warning("dropped a message: %s", exc)
        self.metrics.rejected.labels(exc.reason).inc()
        self.counts["rejected"] += 1

    def ready_samples(self) -> int:
        """Drop stale rollouts from the head of the queue; the env steps of the next batch, or 0."""
        max_lag = self.run_cfg.ppo.max_policy_lag
        while self.queue and self.version - self.queue[0].policy_version > max_lag:
            self.queue.popleft()
            self.metrics.stale_dropped.inc()
            self.counts["stale"] += 1
        need = self.run_cfg.ppo.rollouts_per_batch
        if len(self.queue) < need:
            return 0
        return sum(self.queue[i].num_steps for i in range(need))

    def take_batch(self) -> list[wire.Rollout]:
        batch = [self.queue.popleft() for _ in range(self.run_cfg.ppo.rollouts_per_batch)]
        for r in batch:
            lag = max(self.version - r.policy_version, 0)  # negative: data from before a restart
            self.metrics.policy_lag.observe(lag)
            self.lags.append(lag)
        return batch

    def read_directives(self) -> None:
        while self.cfg.rank == 0 and self.directives.poll(0, zmq.POLLIN):
            parts = self.directives.recv_multipart()
            try:
                if len(parts) != 2:
                    raise wire.WireError("garbage", f"{len(parts)} frames on the broadcast")
                message = wire.decode(parts[1])
            except wire.WireError as exc:
                self.reject(exc)
                continue
            if isinstance(message, wire.Directive) and message.kind == "stop":
                log.info("coordinator says stop: %s", message.reason)
                self.stop.set("directive")

    # --- the run ------------------------------------------------------------------------------

    def run(self, max_updates: int | None = None) -> int:
        assign = transport.request_assignment(self.control, wire.Hello(
            role="learner", name=self.name, pid=os.getpid(), rank=self.cfg.rank,
            experience_endpoint=self.endpoint, metrics_port=self.metrics_port,
        ), self.stop, on_reject=self.reject)  # fmt: skip
        if assign is None:
            return EXIT_OK
        self.run_cfg: RunConfig = assign.config
        self.credits = CreditLedger(self.run_cfg.rollouts_in_flight, self.cfg.credit_timeout_s)
        self.spec = assign.env_spec
        device = distributed.pick_device(self.cfg.device)
        torch.manual_seed(self.run_cfg.seed)
        core = ActorCritic(self.spec, self.run_cfg.hidden_sizes).to(device)
        if assign.weights is not None:  # a restarted world carries on from the last publication
            load_numpy_params(core, dict(assign.weights.params))
            self.version = assign.weights.version
        distributed.init_world(self.cfg.rank, self.cfg.world_size, self.cfg.master_addr, self.cfg.master_port, device)
        log.info("rank %d/%d up on %s, experience at %s", self.cfg.rank, self.cfg.world_size, device, self.endpoint)
        try:
            return self.train(core, device, max_updates)
        finally:
            distributed.shutdown()

    def train(self, core: ActorCritic, device: torch.device, max_updates: int | None) -> int:
        cfg = self.run_cfg.ppo
        model: torch.nn.Module = core
        if self.cfg.world_size > 1:  # DDP broadcasts rank 0's parameters: replicas start equal
            model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.Adam(core.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        generator = torch.Generator().manual_seed(self.run_cfg.seed * 1000 + self.cfg.rank)
        if self.cfg.rank == 0:
            self.publish(core, final=False)
        consumed = 0
        report = RateTimer(self.run_cfg.report_interval_s)
        updates_done = 0
        while True:
            need = cfg.rollouts_per_batch
            self.receive(timeout_ms=0 if len(self.queue) >= need else 10)
            self.read_directives()
            samples = self.ready_samples()
            limit_hit = max_updates is not None and updates_done >= max_updates
            agreed = distributed.agree(samples > 0, self.stop.is_set() or limit_hit, samples, device)
            if agreed.stop:
                break
            if not agreed.everyone_has_batch:
                if report.due():
                    self.report()
                continue
            batch = self.take_batch()
            consumed += agreed.samples
            started = time.perf_counter()
            anneal = ppo.annealed(cfg, consumed, self.run_cfg.total_steps)
            stats = ppo.update(model, core, optimizer, ppo.join_rollouts(batch, device), cfg, generator, anneal)
            self.metrics.update_seconds.observe(time.perf_counter() - started)
            for term, value in stats.items():
                self.metrics.loss.labels(term).set(value)
            self.version += 1
            updates_done += 1
            self.counts["updates"] += 1
            self.counts["samples"] += samples
            self.metrics.updates.inc()
            self.metrics.samples.inc(samples)
            if self.cfg.rank == 0 and self.version % cfg.publish_every == 0:
                self.publish(core, final=False)
            if report.due():
                self.report()
        if self.cfg.rank == 0:
            self.publish(core, final=True)
        self.report()
        return EXIT_OK

    def publish(self, core: torch.nn.Module, final: bool) -> None:
        weights = wire.Weights(member=0, version=self.version, params=to_numpy_params(core), final=final)
        transport.send(self.control, weights)

    def report(self) -> None:
        lags, self.lags = self.lags, []
        transport.send(self.control, wire.LearnerReport(
            name=self.name, rank=self.cfg.rank, policy_version=self.version,
            updates=self.counts.pop("updates", 0), samples=self.counts.pop("samples", 0),
            stale_dropped=self.counts.pop("stale", 0), rejected=self.counts.pop("rejected", 0),
            mean_policy_lag=float(np.mean(lags)) if lags else 0.0,
        ))  # fmt: skip

    def close(self) -> None:
        for sock in (self.control, self.experience, self.directives):
            sock.close()


def main(cfg: LearnerConfig, stop: StopFlag, max_updates: int | None = None) -> int:
    torch.set_num_threads(cfg.torch_threads)
    learner = Learner(cfg, stop)
    try:
        return learner.run(max_updates)
    except Exception:
        log.exception("learner rank %d failed", cfg.rank)
        return EXIT_FAILED
    finally:
        learner.close()
