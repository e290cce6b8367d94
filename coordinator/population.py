"""The population as the coordinator keeps it: member records, which actor collects for which
member, fitness, and the PBT decisions (the selection rules themselves: pbt.py) or CEM-RL's
generations (generations.py), which share the decisions' log, ids and way to the learners.

With `method = "pbt"`, a decision is taken when a member has trained `pbt.interval` env steps since
the last one about it (other methods take none here):

    log it to the Redis stream under the next id
    → apply it to the member records (one transaction, which also records the applied id)
    → send it to the learners, again every tick until learner rank 0 reports it applied

A coordinator that dies between logging and applying finds the logged decision when it restarts
and applies it then; the stream refuses a second entry under the same id. So no decision is lost,
and none is applied twice — learners too apply each id once, in order.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np
from prometheus_client import Counter

from rlmq.common import failpoints, wire
from rlmq.common.algorithms import ActorCriticConfig
from rlmq.common.config import RunConfig
from rlmq.coordinator import bandit, pbt
from rlmq.coordinator.generations import Generations
from rlmq.coordinator.records import LoggedDecision, LoggedDiversityWeight, LoggedGeneration, MemberRecord
from rlmq.coordinator.store import RunStore

log = logging.getLogger("rlmq.coordinator")


class Population:
    def __init__(
        self, store: RunStore, run_config: RunConfig, failpoint: str = "", decisions_metric: Counter | None = None
    ) -> None:
        self.store, self.run_config, self.failpoint = store, run_config, failpoint
        self.decisions_metric = decisions_metric  # rlmq_pbt_decisions_total{selection, kind}
        self.size = run_config.population
        self.records = store.members()
        if not self.records:
            base = run_config.base_hyperparams()
            ranges = run_config.pbt.ranges if run_config.method == "pbt" else {}  # others train the config's
            initial = pbt.initial_hyperparams(base, ranges, self.size, run_config.seed, run_config.pbt.start)
            self.records = {m: MemberRecord(hyperparams=hp) for m, hp in enumerate(initial)}
            store.put_members(self.records)
        self.applied = store.applied_decision()
        for entry in store.decisions(after=self.applied):  # logged, then the coordinator died
            log.info("applying decision %d, logged before a restart", entry.id)
            self.apply(entry)
        self.generations = Generations(store, run_config) if run_config.method == "cem" else None
        self.generation: LoggedGeneration | None = None  # the last applied
        if self.generations is not None:
            logged = store.generations(after=max(self.applied - 1, 0))
            self.generation = next((e for e in logged if e.id == self.applied), None)
            for unapplied in (e for e in logged if e.id > self.applied):
                log.info("applying generation %d, logged before a restart", unapplied.id)
                self.apply_generation(unapplied)
        self.weights_log: list[LoggedDiversityWeight] = []  # DvD's adaptive λ: every choice, oldest first
        if run_config.method == "dvd" and run_config.dvd.adaptive:
            self.weights_log = [e for e in store.diversity_weights() if e.id <= self.applied]
            for chosen in store.diversity_weights(after=self.applied):
                log.info("applying DvD weight %d, logged before a restart", chosen.id)
                self.apply_diversity_weight(chosen)
        self.learner_applied = store.status().learner_applied_decision
        self.actors: dict[str, tuple[int, float]] = {}  # actor name → (member, last heard: monotonic s)

    # --- actors -------------------------------------------------------------------------------

    def check(self, member: int) -> None:
        if not 0 <= member < self.size:
            raise wire.WireError("unknown_member", f"member {member} of {self.size}")

    def assign(self, actor: str, timeout_s: float) -> int:
        """The member an actor collects for: its old one if it is known (a restarted actor), else
        the member with the fewest live actors, then the fewest env steps. With fewer actors than
        members, the members left without an actor wait (and take no part in PBT) until one comes."""
        now = time.monotonic()
        # Forget actors long gone (a fleet replaces pods with new names): the map stays bounded.
        self.actors = {name: (m, heard) for name, (m, heard) in self.actors.items() if now - heard < 10 * timeout_s}
        if actor in self.actors:
            member = self.actors[actor][0]
        else:
            load = [0] * self.size
            for m, heard in self.actors.values():
                load[m] += now - heard < timeout_s
            steps = self.store.member_steps()
            member = min(range(self.size), key=lambda m: (load[m], steps.get(m, 0), m))
        self.actors[actor] = (member, now)
        return member

    def heard(self, actor: str, member: int) -> None:
        self.actors[actor] = (member, time.monotonic())

    # --- fitness ------------------------------------------------------------------------------

    def recent_returns(self) -> dict[int, list[float]]:
        return {m: self.store.recent_returns(m) for m in range(self.size)}

    def judged(self, recent: dict[int, list[float]]) -> dict[int, list[float]]:
        """Each member's last `fitness_episodes` returns, for members with that many."""
        k = self.run_config.pbt.fitness_episodes
        return {m: r[:k] for m, r in recent.items() if len(r) >= k}

    def best(self, recent: dict[int, list[float]]) -> tuple[int, float | None, bool]:
        """(member, mean of its last `return_window` returns, whether it has that many) for the best
        member: the highest mean among members with a full window, else among those with
        `fitness_episodes`, else among any — a member with a few lucky episodes (just after a copy)
        must not outrank one with a long record."""
        window = self.run_config.return_window
        for enough in (window, min(self.run_config.pbt.fitness_episodes, window), 1):
            means = {m: float(np.mean(r[:window])) for m, r in recent.items() if len(r) >= enough}
            if means:
                member = max(means, key=lambda m: (means[m], -m))
                return member, means[member], len(recent[member]) >= window
        return 0, None, False

    # --- decisions ----------------------------------------------------------------------------

    def due(self) -> dict[int, int]:
        """The members that have trained `interval` env steps since the last decision about them, and
        their env steps."""
        if self.size == 1 or self.run_config.method != "pbt":
            return {}
        steps = self.store.member_steps()
        return {
            m: steps.get(m, 0)
            for m in range(self.size)
            if steps.get(m, 0) - self.records[m].steps_at_decision >= self.run_config.pbt.interval
        }

    def tick(self, fitness: dict[int, list[float]], run_env_steps: int, ready: set[int] | None = None) -> None:
        """Decide about every member that is due (and `ready`: its fitness is fresh), each member's
        fitness the returns given (the run's evaluations, or `judged` reports)."""
        for target, steps in self.due().items():
            if ready is None or target in ready:
                self.decide(target, steps, fitness, run_env_steps)

    def decide(self, target: int, steps: int, returns: dict[int, list[float]], run_env_steps: int) -> None:
        decision_id = self.applied + 1
        hyperparams = [self.records[m].hyperparams for m in range(self.size)]
        rng = pbt.decision_rng(self.run_config.seed, decision_id * 1024 + target)  # targets decide apart
        choice = pbt.decide(self.run_config.pbt, returns, target, hyperparams, rng)
        if choice is None:  # it carries on; judge it again after another interval
            self.records[target] = dataclasses.replace(self.records[target], steps_at_decision=steps)
            self.store.put_members({target: self.records[target]})
            return
        entry = LoggedDecision(
            id=decision_id,
            time=time.time(),
            target=target,
            source=choice.source,
            kind="explore" if choice.source == target else "exploit",
            hyperparams=choice.hyperparams,
            previous=self.records[target].hyperparams,
            generation=self.records[choice.source].generation + 1,
            env_steps=steps,
            run_env_steps=run_env_steps,
            fitness={str(m): float(np.mean(r)) for m, r in returns.items()},
        )
        if not self.store.append_decision(entry):  # logged already, by another coordinator: apply that one
            entry = self.store.decisions(after=decision_id - 1)[0]
        failpoints.reach(self.failpoint, failpoints.PBT_AFTER_APPEND, "between logging and applying a decision")
        self.apply(entry)

    def apply(self, entry: LoggedDecision) -> None:
        target = entry.target
        record = MemberRecord(
            hyperparams=entry.hyperparams,
            generation=entry.generation,
            parent=entry.source,
            steps_at_decision=entry.env_steps,
        )
        self.store.apply_decision(entry.id, target, record, copied=entry.source != target)
        self.records[target], self.applied = record, entry.id
        if self.decisions_metric is not None:
            self.decisions_metric.labels(self.run_config.pbt.selection, entry.kind).inc()
        log.info(
            "PBT decision %d: member %d ← member %d (%s), %s",
            entry.id,
            target,
            entry.source,
            entry.kind,
            ", ".join(f"{k} {v:.3g}" for k, v in sorted(entry.hyperparams.items()) if v != entry.previous.get(k)),
        )

    def next_generation(
        self, returns: dict[int, list[float]], weights: dict[int, wire.Weights], run_env_steps: int
    ) -> None:
        """CEM-RL: log and apply the next generation once it is due, the learners having taken the
        last (the members' returns are evidence of their draws only from then)."""
        if self.generations is None or self.learner_applied < self.applied:
            return
        due = self.generations.due(self.applied, returns, weights, run_env_steps)
        if due is None:
            return
        entry, dist = due
        if not self.store.append_generation(entry, dist):  # logged already, by another coordinator: apply that one
            entry = self.store.generations(after=entry.id - 1)[0]
        failpoints.reach(self.failpoint, failpoints.PBT_AFTER_APPEND, "between logging and applying a generation")
        self.apply_generation(entry)

    def apply_generation(self, entry: LoggedGeneration) -> None:
        records = {
            m: dataclasses.replace(self.records[m], generation=entry.generation, parent=-1) for m in range(self.size)
        }
        self.store.apply_generation(entry, records, previous=self.applied)
        self.records, self.applied, self.generation = records, entry.id, entry
        if self.decisions_metric is not None:
            self.decisions_metric.labels("cem", "generation").inc()
        fitness = ", ".join(f"{m} {v:.1f}" for m, v in entry.fitness.items()) or "none yet"
        log.info(
            "CEM generation %d (id %d): fitness %s; elites %s; spread %.3g",
            entry.generation,
            entry.id,
            fitness,
            entry.elites,
            entry.spread,
        )

    def next_diversity_weight(self, returns: dict[int, list[float]], run_env_steps: int) -> None:
        """DvD's adaptive λ: every `dvd.interval` env steps of the run, the bandit's next choice
        (coordinator/bandit.py), judged by the population's best fitness now, logged and applied."""
        cfg, section = self.run_config.dvd, self.run_config.algo_config
        if self.run_config.method != "dvd" or not cfg.adaptive or not isinstance(section, ActorCriticConfig):
            return
        since = self.weights_log[-1].run_env_steps if self.weights_log else 0
        k = cfg.fitness_episodes
        scores = [float(np.mean(r[:k])) for r in returns.values() if len(r) >= k]
        if run_env_steps - since < cfg.interval or not scores:
            return
        arms = (0.0, section.diversity_weight)
        choices = [len(arms) - 1, *(e.arm for e in self.weights_log)]  # the run starts at the configured λ
        fitness = [-math.inf, *(e.fitness for e in self.weights_log), max(scores)]
        decision_id = self.applied + 1
        arm = bandit.choose(choices, fitness, len(arms), np.random.default_rng([self.run_config.seed, decision_id]))
        alpha, beta = bandit.posterior(choices, fitness, len(arms))
        entry = LoggedDiversityWeight(
            id=decision_id,
            arm=arm,
            weight=arms[arm],
            fitness=max(scores),
            alpha=tuple(alpha.tolist()),
            beta=tuple(beta.tolist()),
            run_env_steps=run_env_steps,
            time=time.time(),
        )
        if not self.store.append_decision(entry):  # logged already, by another coordinator: apply that one
            entry = self.store.diversity_weights(after=decision_id - 1)[0]
        failpoints.reach(self.failpoint, failpoints.PBT_AFTER_APPEND, "between logging and applying a DvD weight")
        self.apply_diversity_weight(entry)

    def apply_diversity_weight(self, entry: LoggedDiversityWeight) -> None:
        self.store.apply_diversity_weight(entry.id)
        self.applied = entry.id
        self.weights_log.append(entry)
        if self.decisions_metric is not None:
            self.decisions_metric.labels("dvd", "diversity_weight").inc()
        log.info("DvD weight %d: λ %g at best fitness %.1f", entry.id, entry.weight, entry.fitness)

    def for_learners(
        self, weights: dict[int, wire.Weights]
    ) -> list[wire.Decision | wire.Generation | wire.DiversityWeight]:
        """Applied decisions learner rank 0 has not yet reported applying, oldest first; of
        generations and DvD weights, the last alone (it sets all the earlier ones did), a
        generation's actors in the parameters of `weights`."""
        if self.learner_applied >= self.applied:
            return []
        if self.generation is not None:
            return [self.generations.message(self.generation, weights[0])] if self.generations and 0 in weights else []
        if self.weights_log:
            return [wire.DiversityWeight(id=self.weights_log[-1].id, weight=self.weights_log[-1].weight)]
        return [self.to_message(e) for e in self.store.decisions(after=self.learner_applied) if e.id <= self.applied]

    def to_message(self, entry: LoggedDecision) -> wire.Decision:
        noise = self.run_config.pbt.param_noise if entry.kind == "exploit" else 0.0
        return wire.Decision(
            id=entry.id, target=entry.target, source=entry.source, hyperparams=entry.hyperparams, param_noise=noise
        )

    def learner_reported(self, applied: int) -> list[int]:
        """Learner rank 0 has applied decisions up to `applied` (capped at ours: a report cannot
        make us skip one); returns the members they gave new weights. Fewer than it reported
        before: a learner world that resumed from an older checkpoint, to be sent the rest again."""
        applied = min(applied, self.applied)
        if applied < self.learner_applied:
            log.info(
                "the learners resumed with PBT decisions up to %d applied: sending %d to %d again",
                applied,
                applied + 1,
                self.learner_applied,
            )
            self.learner_applied = applied
            self.store.set_status(learner_applied_decision=applied)
            return []
        if applied == self.learner_applied:
            return []
        entries = self.store.decisions(after=self.learner_applied)
        self.learner_applied = applied
        self.store.set_status(learner_applied_decision=applied)
        if self.generations is not None:  # every member has a new actor
            return list(range(self.size))
        return [e.target for e in entries if e.id <= applied and e.source != e.target]

    def hyperparams(self) -> tuple[dict[str, float], ...]:
        return tuple(self.records[m].hyperparams for m in range(self.size))
