"""The coordinator's TensorBoard curves (coordinator/curves.py), read back by TensorBoard's own
reader: the run's and each member's points, HParams sessions that follow PBT, and a size bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import tb

from rlmq.common.wire import LearnerReport
from rlmq.coordinator.curves import WINDOW_TAG, Curves
from rlmq.coordinator.records import RunStatus


def report(rank: int, updates: int, losses: dict[str, float]) -> LearnerReport:
    return LearnerReport(
        name=f"learner-{rank}", rank=rank, policy_version=1, updates=updates, samples=64 * updates,
        stale_dropped=0, mean_policy_lag=0.5, losses=losses, queue_depth=3, update_s=0.01 * updates,
    )  # fmt: skip


def test_points_follow_the_runs_env_steps_and_each_member_gets_its_curves_and_sessions(tmp_path: Path) -> None:
    curves = Curves(tmp_path, population=2, max_bytes=2**20)
    hyperparams = {0: (0, {"learning_rate": 1e-3}), 1: (0, {"learning_rate": 3e-3})}
    for tick, step in enumerate((1_000, 2_000, 3_000)):
        curves.episodes(0, [10.0 + tick, 12.0 + tick], [10, 12])
        curves.episodes(1, [20.0], [20])
        curves.learner_report(report(0, 4, {"pg_loss": -0.1 * tick, "v_loss": 1.0}), publisher=True)
        curves.learner_report(report(1, 4, {"pg_loss": 99.0}), publisher=False)  # only rank 0's socket's count
        if step == 3_000:  # PBT: member 0 copies member 1 and perturbs its learning rate
            hyperparams[0] = (1, {"learning_rate": 2.4e-3})
        status = RunStatus(evaluated_return=30.0, evaluated_member=1, evaluated_version=2, evaluated_at_steps=1_500)
        curves.tick(
            step, status, {WINDOW_TAG: 11.0 + tick}, {0: {WINDOW_TAG: 11.0}, 1: {WINDOW_TAG: 20.0}}, hyperparams
        )
    curves.close()

    run = tb.scalars(tmp_path)
    expected = [(1_000, (10 + 12 + 20) / 3), (2_000, (11 + 13 + 20) / 3), (3_000, (12 + 14 + 20) / 3)]
    assert run["episode/return"] == [(s, pytest.approx(v)) for s, v in expected]
    assert [v for _, v in run["learner/pg_loss"]] == pytest.approx([0.0, -0.1, -0.2]) and run["learner/queue_depth"][0][
        1
    ] == 6
    assert run["evaluation/return"] == [(1_500, 30.0)]  # once, however many ticks see it
    member0 = tb.scalars(tmp_path / "member_0")
    assert member0["episode/return"] == [(1_000, 11.0), (2_000, 12.0), (3_000, 13.0)]
    assert [g for _, g in member0["pbt/generation"]] == [0, 0, 1]
    assert [round(s["learning_rate"], 6) for s in tb.sessions(tmp_path / "member_0")] == [1e-3, 2.4e-3]
    assert [round(s["learning_rate"], 6) for s in tb.sessions(tmp_path / "member_1")] == [3e-3]
    assert tb.scalars(tmp_path / "member_1")["evaluation/return"] == [(1_500, 30.0)]


def test_the_curves_stop_at_their_size_bound(tmp_path: Path) -> None:
    curves = Curves(tmp_path, population=1, max_bytes=20_000)
    for step in range(1, 2_000):
        curves.tick(step * 100, RunStatus(), {WINDOW_TAG: float(step), "throughput/env_steps_per_s": 1e4}, {}, {})
    curves.close()
    written = sum(f.stat().st_size for f in tmp_path.rglob("events.out.tfevents.*"))
    assert 10_000 < written <= 20_000, written
    steps = [s for s, _ in tb.scalars(tmp_path)[WINDOW_TAG]]
    assert steps == sorted(steps) and steps[-1] < 199_900  # the first points kept, the later ones not written
