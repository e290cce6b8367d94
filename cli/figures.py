"""The run directory's figures: the learning curve (a line per member with a population) and the
PBT lineage, CEM-RL's generations or DvD's weights. They are built here and written by `rundir`; matplotlib is
imported only when one is drawn, so that `rlmq up` stays light until its run ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlmq.coordinator.records import LoggedDecision, LoggedDiversityWeight, LoggedGeneration, ProgressSample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LABELLED_DECISIONS = 60  # more generation labels than this would cover the arrows
LEGEND_MEMBERS = 12  # more members than this get lines but no legend entries


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: figures for files, never a window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def learning_curve(
    progress: Sequence[ProgressSample],
    title: str,
    target: float | None,
    population: int = 1,
) -> Figure:
    """Mean return against env steps: the run's, or with a population a line per member and the
    best member's dotted over them; the target as a dashed line."""
    plt = pyplot()
    points = [(p.env_steps, p.mean_return) for p in progress if p.mean_return is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if population > 1:
        draw_member_curves(ax, progress, population)
        if points:  # the upper envelope of the members' lines: what the target is judged on
            ax.plot(
                *zip(*points, strict=True),
                color="black",
                linestyle=":",
                linewidth=1,
                label="best member",
            )
    elif points:
        ax.plot(*zip(*points, strict=True), label="mean return (last 100 episodes)")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return" if population == 1 else "mean return (member's last ≤100 episodes)")
    ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:  # a run that ended before its first episode has no lines
        ax.legend(loc="lower right", fontsize=8 if population > 1 else None)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def member_color(member: int) -> Any:
    from matplotlib import colormaps

    return colormaps["tab10" if member < 10 else "tab20"](member % 20)


def draw_member_curves(ax: Axes, progress: Sequence[ProgressSample], population: int) -> None:
    """One line per member: the mean of its recent episodes (≤ 100) at each progress sample,
    against the run's total env steps."""
    steps = np.array([p.env_steps for p in progress], dtype=float)
    for member in range(population):
        # None (no episodes since its last copy: its old returns were dropped) becomes NaN: a gap
        values = np.array([p.members.get(str(member)) for p in progress], dtype=float)
        if np.isnan(values).all():
            continue
        label = f"member {member}" if population <= LEGEND_MEMBERS else None
        ax.plot(steps, values, color=member_color(member), linewidth=1, label=label)


def lineage_figure(
    decisions: Sequence[LoggedDecision],
    population: int,
    end_steps: float,
    title: str,
) -> Figure:
    """Rows are members, x is the run's env steps. Each exploit decision is an arrow from the
    source's row to the target's (the target takes the source's weights), each explore-only
    decision a dot on the target's row; `g<n>` is the generation the target has from then on."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    run_steps = [float(d.run_env_steps) for d in decisions]  # one clock for all members
    end = max([end_steps, *run_steps, 1.0])
    fig, ax = plt.subplots(figsize=(9, min(1.6 + 0.45 * population, 24)), dpi=100)
    for member in range(population):
        ax.hlines(member, 0, end, color=member_color(member), linewidth=2, alpha=0.35)
        ax.text(0, member - 0.12, " g0", fontsize=7, color="dimgray")
    labelled = len(decisions) <= LABELLED_DECISIONS
    for decision, x in zip(decisions, run_steps, strict=True):
        target, source = decision.target, decision.source
        if source == target:
            ax.plot(x, target, "o", color=member_color(target), markersize=5, zorder=3)
        else:
            ax.annotate(
                "",
                xy=(x, target),
                xytext=(x, source),
                arrowprops={"arrowstyle": "-|>", "color": member_color(source), "linewidth": 1.2},
                zorder=3,
            )
        if labelled:
            ax.text(x, target - 0.12, f" g{decision.generation}", fontsize=7, color="dimgray")
    ax.set_yticks(range(population), [f"member {m}" for m in range(population)])
    ax.set_ylim(population - 0.5, -0.5)  # member 0 on top, as in `rlmq status`
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("env steps (whole run)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    exploit = Line2D([], [], color="gray", marker=">", label="exploit: source → target")
    explore = Line2D([], [], color="gray", marker="o", linestyle="", label="explore only")
    # beside the axes: over them it would hide decisions, and below them it meets the x label
    ax.legend(handles=[exploit, explore], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    return fig


def generations_figure(generations: Sequence[LoggedGeneration], population: int, title: str) -> Figure:
    """CEM-RL's generations against the run's env steps: each member's fitness (its draw's
    episodes) as a dot, the elites' filled, and the search distribution's spread on a second axis."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=100)
    judged = [g for g in generations if g.fitness]
    for g in judged:
        for member, fitness in sorted(g.fitness.items()):
            elite = int(member) in g.elites
            color = member_color(int(member)) if population <= LEGEND_MEMBERS else "tab:blue"
            ax.plot(g.run_env_steps, fitness, "o", color=color, markersize=5, fillstyle="full" if elite else "none")
    ax.set_xlabel("env steps (whole run)")
    ax.set_ylabel("fitness (mean return of the draw's episodes)")
    spread = ax.twinx()
    spread.plot([g.run_env_steps for g in generations], [g.spread for g in generations], color="dimgray", linewidth=1)
    spread.set_ylabel("search distribution: mean σ over the weights", color="dimgray")
    ax.set_title(f"{title} (filled: the elites)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def diversity_weight_figure(weights: Sequence[LoggedDiversityWeight], title: str) -> Figure:
    """DvD's adaptive λ against the run's env steps (a step each time the bandit chose), and the
    population's best fitness each choice was made at."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4), dpi=100)
    steps = [w.run_env_steps for w in weights]
    ax.step(steps, [w.weight for w in weights], where="post", color="tab:purple")
    ax.set_xlabel("env steps (whole run)")
    ax.set_ylabel("diversity weight λ", color="tab:purple")
    fitness = ax.twinx()
    fitness.plot(steps, [w.fitness for w in weights], "o", color="dimgray", markersize=3)
    fitness.set_ylabel("best fitness when chosen", color="dimgray")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
