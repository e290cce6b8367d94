"""Naming the learner rank that holds the world up, from the heartbeats (coordinator/stragglers.py)."""

from __future__ import annotations

import time

from rlmq.coordinator.learner_world import LearnerWorld
from rlmq.coordinator.stragglers import SILENT_S, WAITED_S, Pulse, behind


def test_nobody_is_behind_while_every_rank_beats_and_waits_briefly() -> None:
    pulses = {0: Pulse(heard=100.0, iteration=7, waiting_s=0.02), 1: Pulse(heard=99.5, iteration=7, waiting_s=0.0)}
    assert behind(pulses, 2, now=100.5) == {}


def test_a_silent_rank_is_named_and_the_ranks_waiting_for_it_are_not() -> None:
    """SIGSTOP stops every thread of a rank, its heartbeat's too; its peer keeps beating from the
    collective it waits in."""
    pulses = {
        0: Pulse(heard=109.9, iteration=7, waiting_s=9.0),
        1: Pulse(heard=110.0 - SILENT_S - 1, iteration=7, waiting_s=0.0),
    }
    named = behind(pulses, 2, now=110.0)
    assert list(named) == [1] and "no heartbeat for 4.0 s" in named[1]


def test_a_rank_that_beats_but_keeps_the_others_waiting_is_named() -> None:
    pulses = {
        0: Pulse(heard=50.0, iteration=3, waiting_s=WAITED_S + 1),
        1: Pulse(heard=50.0, iteration=3, waiting_s=WAITED_S + 0.5),
        2: Pulse(heard=50.0, iteration=2, waiting_s=0.0),
    }
    named = behind(pulses, 3, now=50.2)
    assert list(named) == [2] and "rank(s) 0, 1 waited 6.2 s" in named[2] and "iteration 2" in named[2]


def test_a_rank_that_never_beat_is_named_once_the_others_wait_for_it() -> None:
    waiting = {0: Pulse(heard=10.0, iteration=0, waiting_s=1.0)}
    assert behind(waiting, 2, now=10.0) == {}  # the rendezvous may wait a while for a rank to start
    waiting = {0: Pulse(heard=10.0, iteration=0, waiting_s=WAITED_S)}
    assert "never sent a heartbeat" in behind(waiting, 2, now=10.0)[1]


def test_a_rank_silent_while_a_beating_peer_waits_for_it_is_hung_and_a_world_paused_as_a_whole_is_not() -> None:
    from rlmq.coordinator.stragglers import hung

    now = 100.0
    stopped = Pulse(heard=now - SILENT_S - 1, iteration=7, waiting_s=0.0, since=0.0)
    waiting = Pulse(heard=now - 0.5, iteration=8, waiting_s=4.0, since=50.0)  # beating all along
    assert hung({0: waiting, 1: stopped}, now) == [1]
    assert hung({0: waiting._replace(waiting_s=0.0), 1: stopped}, now) == []  # nobody waits for it (yet)
    assert hung({0: stopped, 1: stopped}, now) == []  # every rank stopped: paused, not hung
    # Both stopped for a minute and resumed: rank 0 beats first, already waiting, its peer a heartbeat later.
    resumed = Pulse(heard=now - 0.1, iteration=8, waiting_s=61.0, since=now - 0.1)
    assert hung({0: resumed, 1: stopped}, now) == []


def test_the_learner_world_reports_each_change_of_who_holds_it_up_once() -> None:
    """What the coordinator writes to the run's status: a field when it changes, nothing between."""
    world = LearnerWorld(2, {})
    now = time.monotonic()
    world.pulses = {0: Pulse(now, 7, waiting_s=1.0, since=now - 2 * SILENT_S), 1: Pulse(now, 7, 0.0, since=now)}
    # The first check writes both, clearing what a coordinator before this one may have left.
    assert world.check() == {"learners_behind": "", "learners_hung": ()}
    assert world.check() == {}
    world.pulses[1] = Pulse(now - SILENT_S - 1, 7, 0.0)  # rank 1 stopped; rank 0 waits for it
    changed = world.check()
    assert changed["learners_hung"] == (1,)
    assert str(changed["learners_behind"]).startswith("learner-1 (rank 1): no heartbeat for ")
    assert world.check() == {} and world.behind.keys() == {1}
    world.pulses[1] = Pulse(time.monotonic(), 8, 0.0)  # it resumed
    assert world.check() == {"learners_behind": "", "learners_hung": ()}
