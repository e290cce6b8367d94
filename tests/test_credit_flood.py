"""Fair credits under any number of identities (issue 41): 200 sockets holding the fleet's key, each
a new actor name, renew their requests for credit and never send a rollout. Real services, real
CURVE sockets, a real Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlmq.common.loading import load_run_config
from rlmq.coordinator.records import RunStatus
from tests.helpers.fleet_run import FleetRun, Flood

CONFIG = load_run_config(Path(__file__).resolve().parent.parent / "configs" / "ppo-cartpole.toml", {})


def time_to_target(root: Path, crowd: bool) -> tuple[float, RunStatus, str]:
    """One actor trains CartPole to 475, alone or with the crowd asking from before it starts: the
    seconds from the actor's start to the end, the final status and, with the crowd, what `rlmq
    status` says of the run (each silent identity is found out when its probation credit is taken
    back unused)."""
    run = FleetRun(
        root, dataclasses.replace(CONFIG, target_return=475.0, total_steps=1_000_000), actors=1, start_actors=False
    )
    shown = ""
    try:
        with Flood(run.keys, run.experience, identities=200) if crowd else contextlib.nullcontext():
            time.sleep(1.0 if crowd else 0.0)  # the crowd is connected and asking
            run.start_actors()
            end = run.wait(lambda s: s.state in ("stopping", "done"), 120, "the target")
        assert end.ended_at is not None
        if crowd:  # asked after the end: a Python process started meanwhile would take a core from the run
            shown = subprocess.run(
                [sys.executable, "-m", "rlmq.cli", "status", "--redis-url", run.redis.url, "--run", "flood"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
        return end.ended_at - run.actors_started_at, end, shown
    finally:
        run.close()


@pytest.mark.slow
def test_a_crowd_of_identities_that_never_deliver_slows_a_run_to_475_by_less_than_twice_and_is_reported(
    tmp_path: Path,
) -> None:
    """The same CartPole run (the shipped config, seed 0, one actor) twice: alone, and with 200
    identities holding the fleet's key asking for credit before the actor starts and all along. With
    the crowd it reaches 475 within twice the time alone (the actor is served within the budget once
    it has delivered, the crowd one at a time on probation beside it), and the learner's log, the
    coordinator's status and `rlmq status` name the crowd. (benchmarks/bench_credit_flood.py runs
    more seeds, two actors, and the crowd arriving later too.)"""
    alone, alone_end, _ = time_to_target(tmp_path / "alone", crowd=False)
    crowded, crowded_end, shown = time_to_target(tmp_path / "crowd", crowd=True)
    print(
        f"to 475: alone {alone:.1f} s ({alone_end.env_steps_at_end:,} env steps), with the crowd {crowded:.1f} s "
        f"({crowded_end.env_steps_at_end:,} env steps)"
    )
    assert alone_end.success and crowded_end.success, (alone_end, crowded_end)
    assert crowded <= 2 * alone, (alone, crowded)
    assert "identities hold credit requests at the learners and send no rollout" in shown, shown
    assert "hold credit requests and send no rollout" in (tmp_path / "crowd" / "learner.log").read_text()
