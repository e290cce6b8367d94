"""Fair credits under any number of identities (issue 41): 200 sockets holding the fleet's key, each
a new actor name, renew their requests for credit and never send a rollout. Real services, real
CURVE sockets, a real Redis."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlmq.common.config import RunConfig
from tests.helpers.fleet_run import FleetRun, Flood

WINDOW_S = 4.0


def steps_per_s(run: FleetRun, seconds: float) -> float:
    before, start = run.status().env_steps, time.monotonic()
    time.sleep(seconds)
    return (run.status().env_steps - before) / (time.monotonic() - start)


@pytest.mark.slow
def test_identities_that_hold_credit_requests_and_never_deliver_barely_slow_a_run_and_are_reported(
    tmp_path: Path,
) -> None:
    """Two actors collect CartPole; then 200 identities with the fleet's key ask for credit every
    0.25 s and never send a rollout. The env steps/s the run counts stay above half what they were
    just before (the proven actors are served within the budget, the crowd one at a time on
    probation beside it), and the coordinator's status and `rlmq status` name them."""
    run = FleetRun(tmp_path, RunConfig(env_id="CartPole-v1", total_steps=10**8), actors=2)
    try:
        run.wait(lambda s: s.env_steps > 20_000, 120, "the actors stepping")
        alone = steps_per_s(run, WINDOW_S)
        with Flood(run.keys, run.experience, identities=200):
            status = run.wait(lambda s: s.idle_credit_requests >= 150, 30, "the crowd reported")
            flooded = steps_per_s(run, WINDOW_S)
            shown = subprocess.run([sys.executable, "-m", "rlmq.cli", "status", "--redis-url", run.redis.url, "--run",
                                    "flood"], capture_output=True, text=True, timeout=60)
        assert flooded >= 0.5 * alone, (alone, flooded)
        assert "identities hold credit requests at the learners and send no rollout" in shown.stdout, shown.stdout
        assert status.idle_credit_requests <= 200
        assert "hold credit requests and send no rollout" in (tmp_path / "learner.log").read_text()
    finally:
        run.close()
