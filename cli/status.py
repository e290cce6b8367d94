"""`rlmq status`: what a run is doing, read from Redis."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from rlmq.cli.rundir import run_redis_of
from rlmq.common.algorithms import ALGORITHMS
from rlmq.common.architecture import activation_named, layers_present, member_widths
from rlmq.common.config import HyperRange, RunConfig
from rlmq.common.redis_urls import shown_url, with_password
from rlmq.common.schema import EnvSpec
from rlmq.common.service import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from rlmq.coordinator.records import LoggedDecision, LoggedDiversityWeight, LoggedGeneration, MemberRecord
from rlmq.coordinator.store import NOT_OUTAGES, OUTAGE_ERRORS, RunStore

PPO_TUNABLE = ALGORITHMS["ppo"].tunable  # the order status lists hyperparameters in

WIDTH = 100  # the population table and decisions wrap to stay within this many columns
RECENT_DECISIONS = 5
SHORT_NAMES = {
    "learning_rate": "lr",
    "ent_coef": "ent",
    "clip_coef": "clip",
    "vf_coef": "vf",
    "gamma": "gamma",
    "gae_lambda": "lambda",
    "max_grad_norm": "grad_norm",
}


def describe_obs(spec: EnvSpec) -> str:
    """`float32[8]`, `uint8[6, 6, 2]`, or `one of 16` for a Discrete observation."""
    if spec.obs_categories:
        return f"one of {spec.obs_categories}"
    return f"{spec.obs_dtype}{list(spec.obs_shape)}"


def show_status(run_dir: Path, redis_url: str | None, run: str | None, password_file: str = "") -> int:
    if redis_url is None or run is None:
        info_path = run_dir / "run.json"
        if not info_path.exists():
            print(
                f"error: no run at {run_dir} (no run.json); give the run directory of an `rlmq up` run "
                "(rlmq status RUN_DIR), or --redis-url and --run",
                file=sys.stderr,
            )
            return EXIT_USAGE
        try:
            own_url, own_run = run_redis_of(run_dir)  # with the password `rlmq up` keeps for its Redis
        except OSError as exc:  # a password file moved, or named relative to where `rlmq up` ran
            print(f"error: {info_path}: {exc}; pass --redis-url, --run and --redis-password-file", file=sys.stderr)
            return EXIT_USAGE
        redis_url, run = redis_url or own_url, run or own_run
    redis_url = with_password(redis_url, password_file)
    store = RunStore.connect(redis_url, run)
    try:
        status = store.status()
        learners = store.learners()
        config = store.load_config()
        run_config = None if config is None else config[0]
        population_view = (
            PopulationView.read(store, run_config.population)
            if run_config is not None and run_config.population > 1
            else None
        )
    except NOT_OUTAGES + (redis.exceptions.NoPermissionError,) as exc:
        print(
            f"error: Redis at {shown_url(redis_url)} refused these credentials ({exc}): give the user in the "
            "URL and its password with --redis-password-file",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except OUTAGE_ERRORS as exc:
        print(
            f"error: cannot reach Redis at {shown_url(redis_url)} ({exc}): is the run still up? "
            "(a TLS server: rediss://)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if not status.state:
        print(f"error: Redis at {shown_url(redis_url)} holds no run {run!r}", file=sys.stderr)
        return EXIT_USAGE
    print(f"run {run}  state {status.state}  {status.detail}")
    if config is not None:
        rc, spec = config
        print(
            f"  {rc.algo} on {rc.env_id} ({spec.action_kind} actions, obs {describe_obs(spec)}); "
            f"target {rc.target_return}, budget {rc.total_steps:,} env steps"
        )
    mean = status.mean_return
    window = config[0].return_window if config is not None else 100
    print(
        f"  env steps {status.env_steps:,}  ({status.steps_per_s:,.0f}/s)  "
        f"episodes {status.episodes:,}  mean return (last {window}) "
        f"{'—' if mean is None else f'{mean:.1f}'}"
    )
    if status.evaluated_return is not None:
        print(
            f"  evaluated (the verdict): member {status.evaluated_member} version {status.evaluated_version}: "
            f"{status.evaluated_return:.1f} ± {status.evaluated_std:.1f} over {status.evaluated_episodes} "
            f"{'deterministic' if status.evaluated_deterministic else 'sampled'} episodes "
            f"at {status.evaluated_at_steps:,} env steps ({status.evaluations} evaluation(s))"
        )
    print(
        f"  policy version {status.policy_version}  policy lag {status.policy_lag:.1f}  "
        f"actors {status.actors}  learners {len(learners)}"
    )
    if status.idle_credit_requests:
        print(
            f"  warning: {status.idle_credit_requests:,} identities hold credit requests at the learners and send "
            "no rollout (a stolen actor key, or actors that cannot collect); they are served last"
        )
    skipped = status.nonfinite_skipped
    if skipped:
        print(
            f"  warning: {skipped:,} member update step(s) skipped: gradient not finite (weights kept; "
            "check the env's rewards and observations)"
        )
    if status.updated_at is not None:
        print(f"  updated {time.time() - status.updated_at:.1f} s ago")
    if run_config is not None and population_view is not None:
        for line in population_lines(run_config, status.best_member, population_view):
            print(line)
    return EXIT_OK


@dataclass(frozen=True)
class PopulationView:
    """What the population table shows, read from Redis in one go (so under one error guard)."""

    members: dict[int, MemberRecord]
    member_steps: dict[int, int]
    returns: dict[int, list[float]]  # member → its recent episode returns, newest first
    decisions: list[LoggedDecision]  # the newest entries of the PBT log, oldest first
    applied: int  # id of the last decision applied to the member records
    generations: list[LoggedGeneration] = dataclasses.field(default_factory=list)  # CEM-RL's newest, oldest first
    weights: list[LoggedDiversityWeight] = dataclasses.field(default_factory=list)  # DvD's newest λ, oldest first

    @classmethod
    def read(cls, store: RunStore, population: int) -> PopulationView:
        return cls(
            members=store.members(),
            member_steps=store.member_steps(),
            returns={m: store.recent_returns(m) for m in range(population)},
            decisions=store.last_decisions(RECENT_DECISIONS),
            applied=store.applied_decision(),
            generations=store.last_generations(RECENT_DECISIONS),
            weights=store.last_diversity_weights(RECENT_DECISIONS),
        )


def population_lines(run_config: RunConfig, best: int, view: PopulationView) -> list[str]:
    ranges = run_config.pbt.ranges
    k = run_config.cem.fitness_episodes if run_config.method == "cem" else run_config.pbt.fitness_episodes
    lines = [
        "",
        f"  population of {run_config.population} by {run_config.method}  "
        f"(* best; fitness: mean of the last {k} episodes)",
        f"    {'member':>6}  {'gen':>3}  {'parent':>6}  {'env steps':>11}  {'fitness':>8}  "
        f"{'last 100':>8}  hyperparameters",
    ]
    for member in range(run_config.population):
        record = view.members.get(member, MemberRecord(hyperparams={}))
        recent = view.returns.get(member, [])
        parent = record.parent
        row = (
            f"  {'*' if member == best else ' '} {member:>6}  {record.generation:>3}  "
            f"{'-' if parent < 0 else parent:>6}  {view.member_steps.get(member, 0):>11,}  "
            f"{_mean(recent[:k]) if len(recent) >= k else '—':>8}  {_mean(recent) if recent else '—':>8}  "
        )
        lines += wrap(row, hyperparam_words(record.hyperparams, ranges))
    if run_config.method == "cem":
        return lines + generation_lines(view)
    if run_config.method == "dvd" and run_config.dvd.adaptive:
        return lines + diversity_weight_lines(view)
    if view.decisions:
        shown = view.decisions[-RECENT_DECISIONS:]
        # logged but not applied: the coordinator stopped in between (it applies them on restart)
        pending = view.decisions[-1].id - view.applied
        lines += [
            "",
            f"  PBT decisions: {view.applied} applied"
            + (f", {pending} logged but not yet applied" if pending > 0 else "")
            + f"; the last {len(shown)}:",
            f"  {'id':>5}  {'kind':<7}  {'member ← source':<22}  {'env steps':>11}  {'gen':>3}  changed (old → new)",
        ]
        for decision in shown:
            move = f"member {decision.target} ← member {decision.source}"
            row = (
                f"  {decision.id:>5}  {decision.kind:<7}  {move:<22}  "
                f"{decision.env_steps:>11,}  {decision.generation:>3}  "
            )
            lines += wrap(row, changed_words(decision, ranges))
    elif run_config.method == "pbt":
        lines += ["", "  PBT decisions: none yet"]
    else:
        lines += ["", f"  PBT decisions: none (method {run_config.method} takes none)"]
    return lines


def generation_lines(view: PopulationView) -> list[str]:
    """CEM-RL's newest generations: each one's fitness, its elites and the distribution's spread."""
    if not view.generations:
        return ["", "  CEM generations: none yet (the first draws once member 0 has published its actor)"]
    pending = view.generations[-1].id - view.applied
    lines = [
        "",
        f"  CEM generations: {view.applied} applied"
        + (f", {pending} logged but not yet applied" if pending > 0 else "")
        + f"; the last {len(view.generations)}:",
        f"  {'gen':>5}  {'run env steps':>13}  {'best':>8}  {'mean':>8}  {'spread':>8}  elites, fittest first",
    ]
    for g in view.generations:
        scores = list(g.fitness.values())
        best, mean = (f"{max(scores):.1f}", _mean(scores)) if scores else ("—", "—")
        elites = ", ".join(map(str, g.elites)) or "— (the first draw)"
        lines.append(f"  {g.generation:>5}  {g.run_env_steps:>13,}  {best:>8}  {mean:>8}  {g.spread:>8.3g}  {elites}")
    return lines


def diversity_weight_lines(view: PopulationView) -> list[str]:
    """DvD's newest choices of λ, with the population's best fitness when each was made."""
    if not view.weights:
        return ["", "  DvD weights: none chosen yet (the configured λ holds)"]
    lines = [
        "",
        f"  DvD weights: λ {view.weights[-1].weight:g} now; the last {len(view.weights)} choices:",
        f"  {'id':>5}  {'run env steps':>13}  {'λ':>6}  {'best fitness':>12}  posterior Beta(α, β) per arm",
    ]
    for w in view.weights:
        beliefs = ", ".join(f"({a:g}, {b:g})" for a, b in zip(w.alpha, w.beta, strict=True))
        lines.append(f"  {w.id:>5}  {w.run_env_steps:>13,}  {w.weight:>6g}  {w.fitness:>12.1f}  {beliefs}")
    return lines


def _mean(values: Sequence[float]) -> str:
    return f"{sum(values) / len(values):.1f}"


def format_value(name: str, value: float, hyper_range: HyperRange | None) -> str:
    if name == "activation":  # a code: the name says it
        return activation_named(value)
    # Log-ranged values (learning rates) span decades: only an exponent keeps them comparable.
    return f"{value:.1e}" if hyper_range is not None and hyper_range.log else f"{value:.3g}"


def _ordered(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda n: (PPO_TUNABLE.index(n) if n in PPO_TUNABLE else len(PPO_TUNABLE), n))


def hyperparam_words(hyperparams: Mapping[str, float], ranges: Mapping[str, HyperRange]) -> list[str]:
    """`lr 1.2e-03`, `ent 0.004`, `activation elu`, `layers 64×32`: the ranged hyperparameters and
    the mutated shape only, as the others never change."""
    words = [
        f"{SHORT_NAMES.get(name, name)} {format_value(name, hyperparams[name], ranges.get(name))}"
        for name in _ordered([*ranges, "activation"])
        if name in hyperparams
    ]
    widths = member_widths(hyperparams)
    if widths is not None:
        words.append("layers " + "×".join(str(w) for w in widths[: layers_present(widths)]))
    return words


def changed_words(decision: LoggedDecision, ranges: Mapping[str, HyperRange]) -> list[str]:
    new, old = decision.hyperparams, decision.previous
    words = []
    for name in _ordered(new):
        if name in old and old[name] == new[name]:
            continue
        before = "?" if name not in old else format_value(name, old[name], ranges.get(name))
        words.append(f"{SHORT_NAMES.get(name, name)} {before} → {format_value(name, new[name], ranges.get(name))}")
    return words or ["none"]


def wrap(prefix: str, words: Sequence[str], width: int = WIDTH) -> list[str]:
    """`prefix` then `words` two spaces apart; words that would pass `width` go on continuation
    lines indented to where the first word began, so the table's columns stay readable."""
    lines, line = [], prefix
    for word in words:
        started = len(line) > len(prefix)
        if started and len(line) + 2 + len(word) > width:
            lines.append(line.rstrip())
            line, started = " " * len(prefix), False
        line += ("  " if started else "") + word
    lines.append(line.rstrip())
    return lines
