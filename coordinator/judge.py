"""What the run's evaluator is asked, and what its answers are worth.

Actors' reports say when a member may be good enough (the mean of its last `return_window` reported
episodes reaches the target) or is due for a PBT decision; the judge then has the member's newest
weights played (coordinator/evaluator.py), and only those episodes decide. So an actor's key can
make the run evaluate sooner or later, and draw its curves, but never end it a success nor win a
PBT copy (docs/architecture.md, "The run judges its policies itself").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import zmq

from rlmq.common import wire
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.evaluator import Evaluator

# Episode seeds of the evaluations: apart from the actors' (run seed + actor index streams) and
# fresh for each evaluation, so that no policy is judged twice on the same starts.
SEED_BASE = 1 << 30


@dataclass(frozen=True)
class Judged:
    """One evaluation: which weights, and what they played."""

    member: int
    version: int
    trained_steps: int
    returns: list[float]
    lengths: list[int]
    seconds: float
    deterministic: bool

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def describe(self) -> str:
        mode = "deterministic" if self.deterministic else "sampled"
        return (f"mean return {self.mean:.1f} ± {self.std:.1f} over {len(self.returns)} {mode} evaluation episodes "
                f"(member {self.member}, version {self.version})")


class Judge:
    def __init__(self, run_config: RunConfig, spec: EnvSpec, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.run_config, self.spec = run_config, spec
        self.settings = run_config.evaluation
        self.evaluator = Evaluator(ctx, self.settings.timeout_s)
        self.evaluator.start()  # now, so that the first verdict does not wait for its imports
        self.wanted: dict[int, int] = {}  # member → the oldest version that would answer; asked in this order
        self.latest: dict[int, Judged] = {}
        self.failed: dict[int, int] = {}  # member → the newest version whose evaluation failed: not asked again
        self.asked = 0
        self.pbt_due: dict[int, int] = {}  # member due for a PBT decision → its version when it fell due

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

    def fitness_ready(self, due: Iterable[int], version_of: Callable[[int], int]) -> set[int]:
        """Of the members `due` for a PBT decision, those evaluated at the version they had when they
        fell due, or a newer one; the others are asked for."""
        self.pbt_due = {m: self.pbt_due.get(m, version_of(m)) for m in due}
        ready = {m for m, version in self.pbt_due.items() if self.evaluated(m, version)}
        for member in self.pbt_due.keys() - ready:
            self.want(member, self.pbt_due[member])
        return ready

    def final_pending(self, member: int, version: int) -> bool:
        """Whether the member's final `version` still waits for its evaluation (asked for if so)."""
        if self.evaluated(member, version) or self.failed.get(member, -1) >= version:
            return False
        self.want(member, version)
        return True

    def fitness(self) -> dict[int, list[float]]:
        """Each evaluated member's returns, for PBT's selection."""
        return {m: judged.returns for m, judged in self.latest.items()}

    def step(self, weights: dict[int, wire.Weights]) -> Judged | str | None:
        """An evaluation that came back (or why one failed), and the next one asked when the evaluator is
        free: the first member wanted whose weights are newer than its last evaluation."""
        outcome: Judged | str | None = None
        answer = self.evaluator.answer()
        if answer is not None:
            request, result = answer
            member, version = request.weights.member, request.weights.version
            if result.error:
                self.failed[member] = version
                outcome = f"the evaluation of member {member} (version {version}) failed: {result.error}"
            else:
                judged = Judged(member, version, request.weights.trained_steps, result.returns.tolist(),
                                result.lengths.tolist(), result.seconds, request.deterministic)
                self.latest[member] = judged
                if self.wanted.get(member, version + 1) <= version:
                    del self.wanted[member]
                outcome = judged
        if not self.evaluator.busy:
            for member in list(self.wanted):
                latest = weights.get(member)
                if (latest is not None and not self.evaluated(member, latest.version)
                        and self.failed.get(member, -1) < latest.version):
                    self.ask(latest)
                    break
        return outcome

    def ask(self, weights: wire.Weights) -> None:
        self.asked += 1
        episodes = self.settings.episodes
        self.evaluator.ask(wire.EvaluationRequest(
            id=self.asked, config=self.run_config, env_spec=self.spec, weights=weights, episodes=episodes,
            deterministic=self.settings.deterministic, seed=SEED_BASE + self.asked * episodes))

    def close(self) -> None:
        self.evaluator.close()
