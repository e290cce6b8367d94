"""The run's records in Redis as typed shapes: a member's record, a PBT decision as logged, the
run's status, a learner rank's registration, a progress sample. `coordinator/store.py` writes and
reads them (and names the keys); the coordinator, `rlmq up`, `rlmq status` and a resumed run read
them through these declarations, checked field by field when read (`loading.from_mapping`: a
record of another shape is a ValueError that names the field)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlmq.common.loading import from_mapping

R = TypeVar("R")


@dataclass(frozen=True)
class MemberRecord:
    """A population member as PBT keeps it."""

    hyperparams: dict[str, float]
    generation: int = 0  # 1 + its source's at each exploit
    parent: int = -1  # the member it copied at its last exploit; -1: none yet
    steps_at_decision: int = 0  # its env steps when PBT last judged it


@dataclass(frozen=True)
class LoggedDecision:
    """A PBT decision as the coordinator logs it (what `wire.Decision` hands the learners, and why)."""

    id: int
    target: int
    source: int  # the target itself: an explore (new hyperparameters, its own weights)
    kind: str  # "explore" | "exploit"
    hyperparams: dict[str, float]  # the target's from now on
    previous: dict[str, float]  # the target's until now
    generation: int
    env_steps: int  # the target's, when decided
    run_env_steps: int  # the run's, when decided
    fitness: dict[str, float] = field(default_factory=dict)  # member → fitness, of those judged
    time: float = 0.0  # unix seconds


@dataclass(frozen=True)
class LoggedGeneration:
    """A CEM-RL generation as the coordinator logs it, in the decisions' stream and under their ids:
    the fitness that moved the search distribution, and what the next draw is (`wire.Generation`
    hands the learners the actors drawn from the distribution logged with it)."""

    id: int
    generation: int  # 1, 2, ...: the first draws from the distribution around an initial actor
    fitness: dict[str, float]  # member → mean return of its draw's episodes; empty for the first
    elites: tuple[int, ...]  # the members that moved the distribution, fittest first
    trained: tuple[int, ...]  # the members the shared critic trains until the next generation
    noise: float  # ε the distribution's variance was given
    spread: float  # the distribution's mean standard deviation over the actor's weights
    run_env_steps: int
    time: float = 0.0  # unix seconds


@dataclass(frozen=True)
class LoggedDiversityWeight:
    """A choice of DvD's adaptive bandit as the coordinator logs it, in the decisions' stream and under
    their ids (`wire.DiversityWeight` hands the learners the weight)."""

    id: int
    arm: int  # 0: no diversity term; 1: the section's diversity_weight
    weight: float  # λ from now on
    fitness: float  # the population's best fitness when chosen (what judges the choice before it)
    alpha: tuple[float, ...]  # each arm's Beta posterior when chosen
    beta: tuple[float, ...]
    run_env_steps: int
    time: float = 0.0  # unix seconds


@dataclass(frozen=True)
class RunStatus:
    """The run's status hash: written field by field (`RunStore.set_status`), read whole."""

    state: str = ""  # running | stopping | done
    reason: str = ""  # why it ended: target | budget
    detail: str = ""
    success: bool = False
    started_at: float = 0.0
    first_step_at: float | None = None  # the earliest env step any actor reports (unix seconds)
    ended_at: float | None = None  # when the coordinator decided the end
    finished_at: float | None = None  # when the learners' final weights were in
    updated_at: float | None = None  # the coordinator's last tick
    env_steps: int = 0  # the sum of the actors' reports
    env_steps_at_end: int | None = None
    episodes: int = 0
    mean_return: float | None = None  # the best member's, over `return_window` episodes
    best_member: int = 0
    steps_per_s: float = 0.0
    policy_lag: float = 0.0
    policy_version: int = 0
    actors: int = 0  # live ones
    learners: int = 0  # live ranks of the current learner world
    pbt_decisions: int = 0  # applied to the member records
    learner_applied_decision: int = 0  # the last decision learner rank 0 reported applying
    nonfinite_skipped: int = 0
    learners_behind: str = ""  # the ranks that hold the learner world up, and why
    learners_hung: tuple[int, ...] = ()  # silent ranks a live rank waits for: `rlmq up` restarts the world
    idle_credit_requests: int = 0  # identities holding credit requests they do not use, over the ranks
    # The latest of the run's own evaluations (coordinator/judge.py): the verdict on the target.
    evaluations: int = 0  # asked so far
    evaluated_member: int = 0
    evaluated_version: int = 0
    evaluated_return: float | None = None  # the mean over its episodes; None: no evaluation yet
    evaluated_std: float = 0.0
    evaluated_episodes: int = 0
    evaluated_deterministic: bool = True
    evaluated_at_steps: int = 0  # the run's env steps when it came back


@dataclass(frozen=True)
class LearnerRecord:
    """A learner rank as it last registered (a restarted coordinator starts from these)."""

    name: str
    endpoint: str  # its experience socket, handed to actors
    pid: int
    metrics_port: int
    identity: str  # its socket identity at the coordinator: rank 0's alone may publish weights


@dataclass(frozen=True)
class ProgressSample:
    """The run at one coordinator tick: a row of metrics.csv, a point of the learning curve."""

    time: float  # unix seconds
    env_steps: int
    episodes: int = 0
    mean_return: float | None = None  # the best member's; None until it has episodes
    steps_per_s: float = 0.0
    policy_lag: float = 0.0
    members: dict[str, float | None] = field(default_factory=dict)  # member → its recent mean return


STATUS_FIELDS = frozenset(f.name for f in dataclasses.fields(RunStatus))


def to_json(record: Any) -> str:
    return json.dumps(dataclasses.asdict(record), sort_keys=True)


def from_json(cls: type[R], text: str | bytes) -> R:
    return from_mapping(cls, json.loads(text))
