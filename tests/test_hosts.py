"""Across hosts for real: the README's several-machines commands, run on five simulated hosts
(network namespaces joined by a userspace switch, tests/helpers/hosts.py) as a user would run them,
with an actor host and then the coordinator's host cut off and healed. Root only (namespaces, TAP
devices): skipped elsewhere, with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import hosts  # tests/helpers: conftest puts them on the path
import pytest
from several_machines import ACTORS, HOSTS, delivered, start, status

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(hosts.why_not() is not None, reason=f"simulated hosts: {hosts.why_not()}"),
]

ACTOR_CUT_S = 12.0  # past the heartbeat timeout (10 s): the connections are dropped and redialled
HUB_CUT_S = 10.0
# Between the learner hosts, with DDP's all-reduce per gradient step (`ppo.sync = "gradients"`, not
# the config's "auto", which replicates and so barely notices the delay), so that the run outlasts
# the actor host's cut: the cut actors must come back to a run that still trains
# (benchmarks/LOG.md §16).
LEARNER_DELAY_S = 0.002


def test_cartpole_across_five_hosts_reaches_its_target_through_partitions_with_every_step_counted(
    tmp_path: Path, repo_root: Path
) -> None:
    with hosts.Hosts(HOSTS, tmp_path) as net:
        net.delay_between("learner-0", "learner-1", LEARNER_DELAY_S)
        watch = start(net, repo_root, ppo_sync="gradients")
        try:
            watch.until(lambda s: all(delivered(s, a) > 0 for a in ACTORS), 90, "every actor's rollouts delivered")

            # An actor host cut off: training goes on; its actors are back within seconds of the heal.
            net.cut("actors-1")
            time.sleep(ACTOR_CUT_S)
            before = {a: delivered(watch.latest, a) for a in ACTORS[2:]}
            net.heal("actors-1")
            healed = time.monotonic()
            watch.until(
                lambda s: all(delivered(s, a) > before[a] for a in before) or s["state"] != "running",
                30,
                "the cut actors' rollouts",
            )
            assert watch.latest["state"] == "running", "the run ended before the cut actors were back: make it longer"
            back_s = time.monotonic() - healed

            # The coordinator's host cut off: nothing it would have counted is lost.
            net.cut("hub")
            time.sleep(HUB_CUT_S)
            net.heal("hub")
            end = watch.until(lambda s: s["state"] == "done", 120, "the run's end")
            assert end["reason"] == "target", end
            # By the end (the coordinator waits for the last reports), every env step the learners
            # took is counted, once: what the run's status says at "done" is final.
            settled = watch.until(
                lambda s: all(t.get("counted_steps") == t.get("delivered_steps") for t in s["tallies"].values()),
                1,
                "the last reports counted",
            )
            shown = status(net, repo_root)  # the README's way to look at the run
        finally:
            watch.close()
    assert shown.returncode == 0 and "run cartpole-1  state done" in shown.stdout, shown.stdout + shown.stderr
    tallies = settled["tallies"]
    print(f"actors back {back_s:.2f} s after the heal; tallies {tallies}; run {settled['env_steps']} env steps")
    assert settled["env_steps"] == sum(t["counted_steps"] for t in tallies.values())
    assert settled["episodes"] == sum(t["counted_episodes"] for t in tallies.values())
    assert all(t["counted_episodes"] == t["delivered_episodes"] for t in tallies.values()), tallies
    assert all(t["claimed_steps"] == t["delivered_steps"] for name, t in tallies.items() if name in ACTORS[:2]), (
        tallies
    )  # never cut off: every rollout arrived
    assert back_s <= 3.0
