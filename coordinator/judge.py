"""What the run's evaluator is asked, and what its answers are worth.

Actors' reports say when a member may be good enough (the mean of its last `return_window` reported
episodes reaches the target) or is due for a PBT decision; the judge then has the member's newest
weights played (coordinator/evaluator.py), and only those episodes decide. So an actor's key can
make the run evaluate sooner or later, and draw its curves, but never end it a success nor win a
PBT copy (docs/architecture.md, "The run judges its policies itself").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.episodes import Evaluation
from rlmq.common.metrics import CoordinatorMetrics
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.evaluator import Evaluator
from rlmq.coordinator.store import RunStore

log = logging.getLogger("rlmq.coordinator")
# Episode seeds of the evaluations: apart from the actors' (run seed + actor index streams) and
# fresh for each evaluation, so that no policy is judged twice on the same starts.
SEED_BASE = 1 << 30


@dataclass(frozen=True)
class Judged:
    """One evaluation: which weights, and what they played."""

    member: int
    version: int
    trained_steps: int
    played: Evaluation
    seconds: float
    deterministic: bool

    def describe(self) -> str:
        mode = "deterministic" if self.deterministic else "sampled"
        return (
            f"mean return {self.played.mean:.1f} ± {self.played.std:.1f} over {len(self.played.returns)} {mode} "
            f"evaluation episodes (member {self.member}, version {self.version})"
        )


class Judge:
    def __init__(
        self,
        run_config: RunConfig,
        spec: EnvSpec,
        ctx: zmq.Context[zmq.Socket[bytes]],
        store: RunStore,
        metrics: CoordinatorMetrics,
    ) -> None:
        self.run_config, self.spec, self.store, self.metrics = run_config, spec, store, metrics
        self.settings = run_config.evaluation
        self.evaluator = Evaluator(ctx, self.settings.timeout_s, run_config.env_id)
        self.evaluator.start()  # now, so that the first verdict does not wait for its imports
        self.wanted: dict[int, int] = {}  # member → the oldest version that would answer; asked in this order
        self.latest: dict[int, Judged] = {}
        self.failed: dict[int, int] = {}  # member → the newest version whose evaluation failed: not asked again
        self.asked = 0
        # member due for a PBT decision → every member's version when it fell due
        self.pbt_due: dict[int, dict[int, int]] = {}

    @property
    def socket(self) -> zmq.Socket[bytes]:
        return self.evaluator.socket

    def evaluated(self, member: int, version: int) -> bool:
        """Whether the member's latest evaluation is of `version` or a newer one."""
        return member in self.latest and self.latest[member].version >= version

    def want(self, member: int, version: int) -> None:
        """Have `member` evaluated at `version` or later (at once, if nothing else is asked first)."""
        if not self.evaluated(member, version):
            self.wanted[member] = min(version, self.wanted.get(member, version))

    def forget(self, member: int) -> None:
        """The member's weights were replaced (a PBT copy): its evaluations are of other weights."""
        self.latest.pop(member, None)

    def fitness_ready(self, due: Iterable[int], members: Iterable[int], version_of: Callable[[int], int]) -> set[int]:
        """Of the members `due` for a PBT decision, those for which every member has been evaluated
        at the version it had when the due one fell due, or a newer one (ranked against older
        evaluations of the others, a member would be ranked against their past); what is missing
        is asked for."""
        self.pbt_due = {m: self.pbt_due.get(m) or {o: version_of(o) for o in members} for m in due}
        ready = set()
        for member, versions in self.pbt_due.items():
            missing = {o: version for o, version in versions.items() if not self.evaluated(o, version)}
            for other, version in missing.items():
                self.want(other, version)
            if not missing:
                ready.add(member)
        return ready

    def final_pending(self, finals: dict[int, int]) -> bool:
        """Whether any member's final weights (`finals`: member → version) still wait for their
        evaluation; every one missing is asked for."""
        missing = [
            member
            for member, version in finals.items()
            if not self.evaluated(member, version) and self.failed.get(member, -1) < version
        ]
        for member in missing:
            self.want(member, finals[member])
        return bool(missing)

    def best_of(self, finals: dict[int, int]) -> Judged | None:
        """The evaluation of final weights (`finals`) that played best; None if none was played.
        Its starts are apart from `rlmq eval`'s, so the member it names is judged afresh there."""
        judged = [self.latest[m] for m, version in finals.items() if self.evaluated(m, version)]
        return max(judged, key=lambda j: (j.played.mean, -j.member), default=None)

    def fitness(self) -> dict[int, list[float]]:
        """Each evaluated member's returns, for PBT's selection."""
        return {m: judged.played.returns for m, judged in self.latest.items()}

    def step(self, weights: dict[int, wire.Weights]) -> Judged | None:
        """An evaluation that came back, recorded (log, metrics, the run's status; a failed one
        logged and counted), and the next one asked when the evaluator is free: the first member
        wanted whose weights are newer than its last evaluation."""
        outcome: Judged | None = None
        answer = self.evaluator.answer()
        if answer is not None:
            request, result = answer
            member, version = request.weights.member, request.weights.version
            if result.error:
                self.failed[member] = version
                log.error("the evaluation of member %d (version %d) failed: %s", member, version, result.error)
                self.metrics.evaluations.labels("failed").inc()
            else:
                played = Evaluation(result.returns.tolist(), result.lengths.tolist())
                outcome = Judged(
                    member, version, request.weights.trained_steps, played, result.seconds, request.deterministic
                )
                self.latest[member] = outcome
                if self.wanted.get(member, version + 1) <= version:
                    del self.wanted[member]
                self.record(outcome)
        if not self.evaluator.busy:
            for member in list(self.wanted):
                latest = weights.get(member)
                if (
                    latest is not None
                    and not self.evaluated(member, latest.version)
                    and self.failed.get(member, -1) < latest.version
                ):
                    self.ask(latest)
                    break
        return outcome

    def record(self, judged: Judged) -> None:
        played = judged.played
        self.metrics.evaluations.labels("played").inc()
        self.metrics.evaluated_return.labels(str(judged.member)).set(played.mean)
        log.info(
            "evaluation: %s, trained on %d env steps, in %.1f s",
            judged.describe(),
            judged.trained_steps,
            judged.seconds,
        )
        self.show(judged)

    def show(self, judged: Judged, **status: int) -> None:
        """The run's status says this evaluation is its latest word (`rlmq status`, the summary)."""
        played = judged.played
        self.store.set_status(
            **status,
            evaluated_return=played.mean,
            evaluated_std=played.std,
            evaluated_episodes=len(played.returns),
            evaluated_member=judged.member,
            evaluated_version=judged.version,
            evaluated_deterministic=judged.deterministic,
            evaluated_at_steps=self.store.status().env_steps,
            evaluations=self.asked,
        )

    def ask(self, weights: wire.Weights) -> None:
        self.asked += 1
        episodes = self.settings.episodes
        self.evaluator.ask(
            wire.EvaluationRequest(
                id=self.asked,
                config=self.run_config,
                env_spec=self.spec,
                weights=weights,
                episodes=episodes,
                deterministic=self.settings.deterministic,
                seed=SEED_BASE + self.asked * episodes,
            )
        )

    def close(self) -> None:
        self.evaluator.close()
