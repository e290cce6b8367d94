"""The coordinator: registers processes, assigns work, keeps the run and its weights in Redis.

    loop until stopped:
        receive one control message (poll with a timeout) → its handler
        an evaluation back from the run's own evaluator → is the target reached? (judge.py)
        every tick: status and progress to Redis; PBT; is the step budget reached?
    when the run is over: broadcast `stop`, wait (bounded) for the last weights and counts (run_end.py)

Redis is its only state: a restarted coordinator reloads config, weights, learners and counters.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from rlmq.common import envs, failpoints, wire
from rlmq.common.config import CoordinatorConfig
from rlmq.common.metrics import CoordinatorMetrics, serve
from rlmq.common.models import make_policy
from rlmq.common.security import check_sender, counting_refusals
from rlmq.common.service import (
    EXIT_OK,
    RateTimer,
    RejectLog,
    StopFlag,
    announce,
    release_freed_memory,
)
from rlmq.coordinator.curves import WINDOW_TAG, Curves
from rlmq.coordinator.judge import Judge
from rlmq.coordinator.learner_world import LearnerWorld
from rlmq.coordinator.population import Population
from rlmq.coordinator.records import LearnerRecord, ProgressSample
from rlmq.coordinator.report_budget import ReportBudget
from rlmq.coordinator.run_end import RunEnd
from rlmq.coordinator.sockets import CoordinatorSockets
from rlmq.coordinator.store import RunStore

log = logging.getLogger("rlmq.coordinator")
TICK_S = 0.5
# The env-steps rate is taken over this many ticks: steps arrive in whole rollouts, several ticks
# apart when a learner trains long between deliveries, and one tick's rate would read 0 between them.
RATE_TICKS = 10
MAX_WAITING_ACTORS = 4096  # actors that said Hello before every learner registered
# Memory freed by the sockets' queues (a flood of subscribers that read nothing) goes back to the
# kernel this often: glibc keeps what other threads' arenas free, so without the trim a flood's
# memory stays held (benchmarks/LOG.md §17).
TRIM_EVERY_S = 10.0


class Coordinator:
    def __init__(self, cfg: CoordinatorConfig, store: RunStore, stop: StopFlag) -> None:
        self.cfg, self.store, self.stop = cfg, store, stop
        self.metrics = CoordinatorMetrics()
        self.metrics_port = serve(self.metrics.registry, cfg.metrics_port, cfg.bind_host)
        announce(cfg.announce_file, metrics_port=self.metrics_port)
        self.sockets = CoordinatorSockets(cfg, counting_refusals(self.metrics.rejected.labels("auth").inc))

        saved, run = store.load_config(), cfg.run_config
        if saved is None:
            self.run_config, self.spec = run, envs.probe(run.env_id, run.algo, run.encoder, run.frame_stack)
            store.save_config(self.run_config, self.spec)
            store.set_status(state="running", reason="", started_at=time.time(), env_steps=0, episodes=0)
        else:  # a restart: Redis holds the truth
            self.run_config, self.spec = saved
            log.info("resuming run %s from Redis", cfg.run)
        self.population = Population(store, self.run_config, cfg.failpoint, self.metrics.pbt_decisions)
        self.latest_weights: dict[int, wire.Weights] = {}
        for member in range(self.population.size):
            weights = store.weights(member)
            if weights is not None:
                self.latest_weights[member] = weights
        learners = store.learners()
        self.learners = LearnerWorld(self.run_config.num_learners, learners)
        # Only rank 0 publishes weights; its socket identity is the one a Weights must come from.
        self.publisher = learners[0].identity.encode() if 0 in learners else None
        self.waiting_actors: dict[bytes, wire.Hello] = {}  # by identity: a Hello repeats
        self.actor_count = 0
        self.report_budget = ReportBudget(self.run_config.report_interval_s, cfg.actor_timeout_s)
        self.learner_lag: dict[int, float] = {}
        self.log_reject = RejectLog(log)
        self.first_step_at = store.status().first_step_at or float("inf")
        # Every rank skips the same steps (their gradients are all-reduced): rank 0's count is the run's.
        self.nonfinite_skipped = store.status().nonfinite_skipped
        self.recent_steps = collections.deque([(time.monotonic(), store.status().env_steps)], maxlen=RATE_TICKS + 1)
        # The verdict on the target and PBT's fitness: the run's own evaluations, unless the run
        # believes its actors (evaluation.episodes = 0).
        self.judge = (
            Judge(self.run_config, self.spec, self.sockets.ctx, store, self.metrics)
            if self.run_config.evaluation.episodes
            else None
        )
        self.end = RunEnd(self.run_config, self.judge is not None, store, self.sockets.broadcast, cfg.shutdown_grace_s)
        every_s = self.run_config.evaluation.every_s
        self.evaluate_every = RateTimer(every_s) if every_s and self.run_config.target_return is not None else None
        self.curves = Curves.open(cfg.tensorboard_dir, self.population.size, cfg.tensorboard_max_mb)
        self.handlers: dict[type, Callable[[bytes, Any, bytes], None]] = {
            wire.Hello: self.on_hello,
            wire.ActorReport: self.on_actor_report,
            wire.LearnerReport: self.on_learner_report,
            wire.LearnerHeartbeat: self.on_learner_heartbeat,
            wire.Weights: self.on_weights,
        }

    # --- handlers -----------------------------------------------------------------------------

    def on_hello(self, identity: bytes, hello: wire.Hello, encoded: bytes) -> None:
        if hello.role == "learner":
            if not 0 <= hello.rank < self.run_config.num_learners:
                raise wire.WireError("bad_value", f"learner rank {hello.rank} outside the world")
            self.learners.register(hello.rank, identity, hello.experience_endpoint)
            if hello.rank == 0:
                self.publisher = identity
            self.store.put_learner(
                hello.rank,
                LearnerRecord(
                    hello.name,
                    hello.experience_endpoint,
                    hello.pid,
                    hello.metrics_port,
                    identity.decode(errors="replace"),
                ),
            )
            self.reply_assign(identity, actor_index=-1)
            self.assign_waiting_actors()
        elif not self.learners.complete():
            self.waiting_actors[identity] = hello
            if len(self.waiting_actors) > MAX_WAITING_ACTORS:  # a flood of Hellos: the oldest go
                del self.waiting_actors[next(iter(self.waiting_actors))]
        else:
            self.assign_actor(identity, hello)

    def assign_waiting_actors(self) -> None:
        if self.waiting_actors and self.learners.complete():
            for waiting, actor_hello in self.waiting_actors.items():
                self.assign_actor(waiting, actor_hello)
            self.waiting_actors.clear()

    def assign_actor(self, identity: bytes, hello: wire.Hello) -> None:
        index = _actor_index(hello.name, default=self.actor_count)
        self.actor_count += 1
        self.store.touch_actor(hello.name)
        member = self.population.assign(hello.name, self.cfg.actor_timeout_s)
        self.reply_assign(identity, actor_index=index, member=member)

    def reply_assign(self, identity: bytes, actor_index: int, member: int = 0) -> None:
        learner = actor_index < 0
        assign = wire.Assign(
            run=self.cfg.run,
            member=member,
            actor_index=actor_index,
            config=self.run_config,
            env_spec=self.spec,
            learner_endpoints=self.learners.endpoint_list(),
            weights=None if learner else self.latest_weights.get(member),
            hyperparams=self.population.hyperparams() if learner else (),
            member_weights=tuple(self.latest_weights[m] for m in sorted(self.latest_weights)) if learner else (),
            # The learners' own count: decisions after it are sent to them again and re-applied, so
            # that a restarted world makes the copies its predecessor had not made yet.
            applied_decision=self.population.learner_applied if learner else 0,
            master_host=self.learners.master_host() if learner else "",
        )
        self.sockets.control.send_multipart([identity, wire.encode(assign)])

    def on_actor_report(self, identity: bytes, report: wire.ActorReport, encoded: bytes) -> None:
        self.population.check(report.member)
        self.population.heard(report.name, report.member)
        if 0 < report.first_step_at < self.first_step_at:  # the earliest any actor reports
            self.first_step_at = report.first_step_at
            self.store.set_status(first_step_at=report.first_step_at)
        returns = report.episode_returns.tolist()
        counted = self.store.add_actor_report(
            report.name,
            report.member,
            report.env_steps,
            self.evidence(report),
            report.session,
            report.steps_total,
            report.episodes_total,
            checked=self.sockets.secure,
        )
        failpoints.reach(self.cfg.failpoint, failpoints.REPORT_BEFORE_ACK, "between counting a report and acking it")
        if report.session:
            ack = wire.ReportAck(
                steps_total=report.steps_total,
                episodes_total=report.episodes_total,
                episodes_uncounted=counted.uncounted,
                steps_uncounted=counted.steps_uncounted,
                report_interval_s=self.report_budget.asked_s,
            )
            self.sockets.control.send_multipart([identity, wire.encode(ack)])
        if self.curves is not None and counted.episodes:  # the newest claims may wait uncounted
            end = len(returns) - min(counted.uncounted, len(returns))
            start = max(end - counted.episodes, 0)
            self.curves.episodes(report.member, returns[start:end], report.episode_lengths[start:end].tolist())
        self.metrics.env_steps.inc(counted.steps)
        self.metrics.member_env_steps.labels(str(report.member)).inc(counted.steps)
        self.metrics.episodes.inc(counted.episodes)
        if report.rejected:
            self.metrics.rejected.labels("at_actor").inc(report.rejected)
        # The end is checked here as well as on the tick: waiting for the tick made every run
        # last ~TICK_S / 2 longer than it had to. Only this member's returns can have changed. If
        # the run is over, the tick comes now: its status and progress sample record the end.
        if self.end.finished_at is None:
            recent = {report.member: counted.recent} if counted.recent else {}
            best, mean_return, full_record = self.population.best(recent)
            if self.judge is not None and self.end.passed is None and self.end.reported(mean_return, full_record):
                self.judge.want(best, self.version_of(best))
                self.evaluate()
            elif self.end.reason(counted.run_steps, mean_return, full_record) is not None:
                self.on_tick()

    def on_learner_report(self, identity: bytes, report: wire.LearnerReport, encoded: bytes) -> None:
        self.learner_lag[report.rank] = report.mean_policy_lag
        if self.curves is not None:
            self.curves.learner_report(report, publisher=report.rank == 0 and identity == self.publisher)
        idle = self.learners.idle_requests(report.rank, report.idle_requests)
        if idle is not None:  # `rlmq status` warns
            self.store.set_status(idle_credit_requests=idle)
        self.end.learner_reported(report.rank, report.update_s, report.final)
        if self.sockets.secure and report.delivered_steps:  # what actors' reports are checked against
            self.store.add_deliveries(report.session, report.delivered_steps, report.delivered_episodes)
        if report.rank == 0 and identity == self.publisher and report.nonfinite_skipped:
            self.nonfinite_skipped += report.nonfinite_skipped
            self.store.set_status(nonfinite_skipped=self.nonfinite_skipped)
        if report.rank == 0 and identity == self.publisher:
            for target in self.population.learner_reported(report.applied_decision):
                # Rank 0 published the new weights before this report: the returns kept since the
                # decision was applied here were the old weights' (`evidence` refuses them from now).
                self.store.clear_returns(target)
                if self.judge is not None:
                    self.judge.forget(target)
        if report.rejected:
            self.metrics.rejected.labels("at_learner").inc(report.rejected)

    def on_learner_heartbeat(self, identity: bytes, beat: wire.LearnerHeartbeat, encoded: bytes) -> None:
        if not 0 <= beat.rank < self.run_config.num_learners:
            raise wire.WireError("bad_value", f"learner rank {beat.rank} outside the world")
        self.learners.beat(beat.rank, beat.iteration, beat.waiting_s)
        self.assign_waiting_actors()

    def check_learners(self) -> None:
        """Name the learner ranks that hold the world up (log, metric, status), while the run lasts."""
        changed = self.learners.check()
        for rank in range(self.run_config.num_learners):
            self.metrics.learner_behind.labels(str(rank)).set(rank in self.learners.behind)
        if changed:
            self.store.set_status(**changed)

    def on_weights(self, identity: bytes, weights: wire.Weights, encoded: bytes) -> None:
        received = time.perf_counter()
        if identity != self.publisher:
            raise wire.WireError("not_publisher", "Weights come from learner rank 0 only")
        self.population.check(weights.member)
        latest = self.latest_weights.get(weights.member)
        if latest is not None and weights.version < latest.version:
            raise wire.WireError("stale_weights", f"version {weights.version} < {latest.version}")
        try:  # every actor would choke on weights that do not fit: refuse them here, once
            make_policy(self.run_config, dict(weights.params), self.spec)
        except (KeyError, ValueError) as exc:
            raise wire.WireError("bad_weights", str(exc)) from exc
        self.latest_weights[weights.member] = weights
        # Not broadcast to the actors: the learners send each actor the weights its credit names
        # (docs/architecture.md, "weights go only with credits"). The copy serves Assigns, the
        # evaluator and restarted learners.
        self.store.put_encoded_weights(weights.member, encoded)
        self.metrics.weights_latency.observe(time.perf_counter() - received)
        self.store.set_status(policy_version=max(w.version for w in self.latest_weights.values()))
        self.end.final_weights = self.end.final_weights or weights.final

    # --- the loop -----------------------------------------------------------------------------

    def handle(self, identity: bytes, encoded: bytes, sender: zmq.Frame | None = None) -> None:
        """One message; `sender` (a secure run's): its part as received, whose key says who sent it."""
        started = time.perf_counter()
        try:
            message = wire.decode(encoded)
            handler = self.handlers.get(type(message))
            if handler is None:
                raise wire.WireError("unexpected_kind", type(message).__name__)
            if self.sockets.secure and sender is not None:  # a secure run: as whom may it speak
                check_sender(sender, message)
            handler(identity, message, encoded)
            if isinstance(message, wire.ActorReport):  # what the fleet's reports cost (report_budget.py)
                self.report_budget.took(time.perf_counter() - started)
        except wire.WireError as exc:
            self.log_reject(exc.reason, str(exc), len(encoded), identity)
            self.metrics.rejected.labels(exc.reason).inc()

    def run(self, until: float | None = None) -> int:
        tick, trim = RateTimer(TICK_S), RateTimer(TRIM_EVERY_S)
        log.info(
            "run %s: %s, %d learner(s); control %s, broadcast %s",
            self.cfg.run,
            self.run_config.env_id,
            self.run_config.num_learners,
            self.sockets.control_endpoint,
            self.sockets.broadcast_endpoint,
        )
        poller = zmq.Poller()
        poller.register(self.sockets.control, zmq.POLLIN)
        if self.judge is not None:
            poller.register(self.judge.socket, zmq.POLLIN)
        while not self.stop.is_set() and (until is None or time.monotonic() < until):
            self.metrics.heartbeat.beat()
            ready = dict(poller.poll(int(TICK_S * 1000)))
            if self.sockets.control in ready:
                parts = self.sockets.control.recv_multipart(copy=False)
                if len(parts) == 2:
                    self.handle(parts[0].bytes, parts[1].bytes, parts[1])
                else:
                    self.metrics.rejected.labels("garbage").inc()
            if self.judge is not None and self.judge.socket in ready:
                self.evaluate()
            if (tick.due() or (self.end.passed is not None and self.end.finished_at is None)) and self.on_tick():
                break
            if trim.due():
                release_freed_memory()
        return EXIT_OK

    def on_tick(self) -> bool:
        """Status, progress and the end of the run; True when the coordinator may exit."""
        if self.end.finished_at is not None:
            return self.finishing()
        self.check_learners()
        self.assign_waiting_actors()
        status = self.store.status()
        steps = status.env_steps
        recent = self.population.recent_returns()
        if self.population.generations is not None:  # CEM-RL: fitness is the draws' own episodes
            self.population.next_generation(recent, self.latest_weights, steps)
        elif self.run_config.method == "dvd":
            self.population.next_diversity_weight(recent, steps)
        elif self.judge is None:
            self.population.tick(self.population.judged(recent), steps)
        else:
            self.population.tick(
                self.judge.fitness(),
                steps,
                self.judge.fitness_ready(self.population.due(), range(self.population.size), self.version_of),
            )
        for decision in self.population.for_learners(self.latest_weights):  # again every tick until applied
            self.sockets.broadcast.send_multipart([wire.DECISION_TOPIC, wire.encode(decision)])
        best, mean_return, full_record = self.population.best(recent)
        now = time.monotonic()
        then, steps_then = self.recent_steps[0]
        rate = (steps - steps_then) / max(now - then, 1e-9)
        self.recent_steps.append((now, steps))
        actors = self.store.live_actors(self.cfg.actor_timeout_s, forget_after_s=10 * self.cfg.actor_timeout_s)
        self.metrics.connected_actors.set(actors)
        self.report_budget.follow(actors)
        self.metrics.connected_learners.set(self.learners.live())
        member_means = {str(m): float(np.mean(r)) if r else None for m, r in recent.items()}
        members = {m: (r.generation, r.hyperparams) for m, r in self.population.records.items()}
        cem_generation, weights_log = self.population.generation, self.population.weights_log
        self.metrics.show_population(
            member_means,
            members,
            cem_spread=cem_generation.spread if cem_generation is not None else None,
            dvd_weight=weights_log[-1].weight if weights_log else None,
        )
        lag = float(np.mean(list(self.learner_lag.values()))) if self.learner_lag else 0.0
        self.store.set_status(
            mean_return=mean_return,
            best_member=best,
            steps_per_s=rate,
            actors=actors,
            learners=self.learners.live(),
            policy_lag=lag,
            updated_at=time.time(),
            pbt_decisions=self.population.applied,
        )
        self.store.append_progress(
            ProgressSample(time.time(), steps, status.episodes, mean_return, rate, lag, member_means)
        )
        if self.curves is not None:
            self.curves.tick(
                steps,
                status,  # this tick's read: an evaluation recorded since is drawn at the next
                {
                    WINDOW_TAG: mean_return,
                    "throughput/env_steps_per_s": rate,
                    "learner/policy_lag": lag,
                    "fleet/actors": actors,
                    "fleet/learner_ranks": self.learners.live(),
                    "pbt/decisions": self.population.applied,
                },
                {int(m): {WINDOW_TAG: value} for m, value in member_means.items()},
                members,
            )
        if self.judge is not None and self.end.passed is None:
            due = self.evaluate_every is not None and self.evaluate_every.due()
            if due or self.end.reported(mean_return, full_record):
                self.judge.want(best, self.version_of(best))
            self.evaluate()
        reason, target = self.end.reason(steps, mean_return, full_record), self.run_config.target_return
        if reason == "target":
            who = f" (member {best})" if self.population.size > 1 else ""
            passed = self.end.passed
            said = passed.describe() if passed is not None else f"mean return {mean_return:.1f}{who}"
            self.end.finish("target", f"{said} ≥ {target:g} at {steps} env steps", True, steps)
        elif reason == "budget":
            detail = f"{steps} env steps ≥ budget {self.run_config.total_steps}"
            self.end.finish("budget", detail, target is None, steps)
        return False

    def evidence(self, report: wire.ActorReport) -> list[float | None]:
        """The report's returns, None for each episode begun under weights the member no longer
        descends from (a PBT copy or a CEM generation replaced them since): counted, but no
        evidence of the member's fitness."""
        latest = self.latest_weights.get(report.member)
        lineage = latest.copied_by if latest is not None else 0
        lineages = report.episode_lineages.tolist() or [0] * len(report.episode_returns)
        return [r if g == lineage else None for r, g in zip(report.episode_returns.tolist(), lineages, strict=True)]

    def version_of(self, member: int) -> int:
        latest = self.latest_weights.get(member)
        return latest.version if latest is not None else 0

    def evaluate(self) -> None:
        """Take an evaluation that came back (the judge records it), and ask the next one."""
        assert self.judge is not None
        judged, target = self.judge.step(self.latest_weights), self.run_config.target_return
        if judged is not None and self.end.finished_at is None and target is not None and judged.played.mean >= target:
            self.end.passed = judged  # the loop runs the tick at once: it records the end

    def finishing(self) -> bool:
        """After the end, each tick: whether the run is done (run_end.py says what it waits for)."""
        # A secure run checks the actors' reports against what the learners took: all counted?
        actors_counted = self.actors_counted if self.sockets.secure else None
        if not self.end.wind_down(self.report_budget.asked_s, actors_counted, self.final_evaluation_pending):
            return False
        if self.curves is not None:  # the final weights' evaluation, which no tick drew
            self.curves.evaluation(self.store.status())
        return True

    def actors_counted(self) -> bool:
        return self.store.uncounted_deliveries(list(self.population.actors)) == 0

    def final_evaluation_pending(self) -> bool:
        """A run that did not end on an evaluation (its budget) has every member's final weights
        evaluated before it is done (within the grace period): the outcome it reports. The best of
        those evaluations names a population's best member, which `rlmq eval` and the summary take:
        the actors' returns, which lag and mix older weights, named it until then."""
        if self.judge is None or self.end.passed is not None or not self.end.final_weights:
            return False
        finals = {m: self.version_of(m) for m in range(self.population.size)}
        if self.judge.final_pending(finals):
            self.evaluate()
            return True
        best = self.judge.best_of(finals)
        if best is not None and self.population.size > 1:
            self.judge.show(best, best_member=best.member)
        return False

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()
        if self.curves is not None:
            self.curves.close()
        self.sockets.close()


def _actor_index(name: str, default: int) -> int:
    """`actor-7` → 7, so a restarted actor gets its old seed stream; otherwise arrival order."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isascii() and tail.isdecimal() and len(tail) <= 6 else default
