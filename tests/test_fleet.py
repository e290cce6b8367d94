"""A large fleet (issue 45): the reports' budget, and a simulated fleet of a few hundred actor
identities (tests/helpers/simulated_fleet.py) against real services, every socket on CURVE."""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlmq.actors.reports import Reports
from rlmq.common import wire
from rlmq.common.loading import load_run_config
from rlmq.common.metrics import ActorMetrics
from rlmq.common.service import die_with_parent
from rlmq.coordinator.report_budget import REPORT_SHARE, report_interval
from tests.helpers.fleet_run import FleetRun

ROOT = Path(__file__).resolve().parent.parent
CONFIG = load_run_config(ROOT / "configs" / "ppo-cartpole.toml", {})


def test_a_fleet_whose_reports_would_take_over_a_quarter_of_the_coordinator_reports_less_often() -> None:
    """Each report taking 0.3 ms: 64 actors report every 0.25 s (7.7 % of the coordinator's time),
    1,024 every 1.2 s (a quarter of it), and no fleet is heard less often than a third of the
    actor timeout, nor any more often than the run asks."""
    assert report_interval(0.25, 64, 0.0003, 10.0) == 0.25
    assert report_interval(0.25, 1024, 0.0003, 10.0) == pytest.approx(1024 * 0.0003 / REPORT_SHARE)
    assert 1024 * 0.0003 / REPORT_SHARE == pytest.approx(1.2288)
    assert report_interval(0.25, 100_000, 0.0003, 10.0) == pytest.approx(10.0 / 3)
    assert report_interval(2.0, 100_000, 0.0003, 3.0) == 2.0


def test_an_actors_reports_follow_the_interval_its_acks_ask_for() -> None:
    reports = Reports("actor-0", 0, ActorMetrics(), interval_s=0.05)
    time.sleep(0.06)
    assert reports.due() and not reports.due()
    nothing = (np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
    reports.next(*nothing, 0.0, 0.0, 1, 0)
    reports.acknowledged(wire.ReportAck(steps_total=0, episodes_total=0, report_interval_s=0.5))
    time.sleep(0.06)
    assert reports.due()  # the period already running ends as it began
    time.sleep(0.06)
    assert not reports.due()  # the next one is the coordinator's
    reports.acknowledged(wire.ReportAck(steps_total=0, episodes_total=0))  # 0: back to the run's
    assert reports.timer.period == 0.05


def test_a_simulated_fleet_of_200_identities_is_served_and_counted_exactly_with_no_weights_broadcast(
    tmp_path: Path,
) -> None:
    """200 identities in one process, each an actor to the services (its own CURVE sockets with
    the fleet's key, Hello, credits, rollouts of real CartPole episodes, reports), train a run to
    its budget. Every identity is assigned and delivers rollouts (newcomers join on probation),
    the weights reach actors only with their credits (nothing on the broadcast), the stop reaches
    every identity, and at "done" each identity's env steps and episodes the learner took are
    counted exactly, the run's total their sum."""
    identities = 200
    run = FleetRun(tmp_path, dataclasses.replace(CONFIG, total_steps=80_000), actors=0, start_actors=False)
    stats = tmp_path / "fleet-stats.jsonl"
    with open(tmp_path / "fleet.log", "wb") as log:
        fleet = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.simulated_fleet", "--keys", str(run.keys)]
            + ["--coordinator", run.control, "--broadcast", run.broadcast]
            + ["--identities", str(identities), "--stats", str(stats)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
    try:
        done = run.wait(lambda s: s.state == "done", 150, "the run's end")
        assert fleet.wait(30) == 0, (tmp_path / "fleet.log").read_text()
        counts = json.loads(stats.read_text().splitlines()[-1])
        tallies = {f"sim-{i}": run.store.tally(f"sim-{i}") for i in range(identities)}
    finally:
        if fleet.poll() is None:
            fleet.kill()
        run.close()
    assert counts["assigned"] == identities and counts["rejected"] == 0, counts
    assert counts["broadcast_weights"] == 0 and counts["learner_weights"] >= identities, counts
    assert all(t.get("delivered_steps", 0) > 0 for t in tallies.values()), "an identity was never served"
    uncounted = {name: t for name, t in tallies.items() if t["counted_steps"] != t["delivered_steps"]}
    assert not uncounted, uncounted
    assert all(t.get("counted_episodes", 0) == t.get("delivered_episodes", 0) for t in tallies.values()), tallies
    assert done.env_steps == sum(t["counted_steps"] for t in tallies.values()) >= 80_000
    assert done.episodes == sum(t.get("counted_episodes", 0) for t in tallies.values())


def test_a_service_raises_its_open_files_limit_to_what_the_system_allows() -> None:
    """A stock soft limit of 1,024 descriptors would refuse a coordinator's 500th actor (two
    connections each): every service takes the hard limit at start."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = subprocess.run(
        [sys.executable, "-c", "from rlmq.common.service import open_files_as_allowed as f; print(f())"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert int(shown) == hard
