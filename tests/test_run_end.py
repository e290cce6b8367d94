"""The end of a run (coordinator/run_end.py): how long the coordinator waits for the learners' last
word, against a real Redis server and a real PUB socket."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import zmq

from rlmq.common.config import RunConfig
from rlmq.coordinator.run_end import REPORTS_REMEMBERED, UPDATE_STRETCH_MAX_S, RunEnd
from rlmq.coordinator.store import RunStore

GRACE_S = 5.0


def waited(end: RunEnd, seconds: float) -> None:
    end.finished_at = time.monotonic() - seconds


@pytest.fixture
def ended(redis_url: str, run_id: str) -> Iterator[RunEnd]:
    """A run over its budget 6 s ago (past the grace), its learners' final weights not in yet."""
    store = RunStore.connect(redis_url, run_id)
    broadcast = zmq.Context.instance().socket(zmq.PUB)
    broadcast.bind("tcp://127.0.0.1:*")
    end = RunEnd(RunConfig(env_id="CartPole-v1", total_steps=1_000), False, store, broadcast, GRACE_S)
    end.finish("budget", "1000 env steps ≥ budget 1000", True, 1_000)
    waited(end, GRACE_S + 1)
    yield end
    broadcast.close(linger=0)
    store.delete_run()


def done(end: RunEnd) -> bool:
    return end.wind_down(0.25, None, lambda: False)


def test_without_long_updates_the_coordinator_gives_up_on_the_final_weights_after_the_grace(ended: RunEnd) -> None:
    ended.learner_reported(0, 0.3, final=False)
    assert done(ended)
    assert ended.store.status().state == "done"


def test_the_wait_for_the_final_weights_stretches_over_the_longest_update_reported(ended: RunEnd) -> None:
    """The learner reads `stop` only once the update under way is done: 20 s updates, 6 s waited."""
    for update_s in (20.0, 18.0, 0.0, 19.5):  # the longest first: the last or the mean would end sooner
        ended.learner_reported(0, update_s, final=False)
    assert not done(ended)
    assert ended.store.status().state == "stopping"
    waited(ended, GRACE_S + 19.75)
    assert not done(ended)
    waited(ended, GRACE_S + 20.0 + 0.5)  # and no word since: a dead learner
    assert done(ended)


def test_only_the_recent_reports_stretch_the_wait(ended: RunEnd) -> None:
    ended.learner_reported(0, 20.0, final=False)
    for _ in range(REPORTS_REMEMBERED):
        ended.learner_reported(0, 0.5, final=False)
    assert done(ended)  # 6 s waited, past the grace and the 0.5 s updates


def test_a_stalled_world_does_not_stretch_the_wait_without_bound(ended: RunEnd) -> None:
    ended.learner_reported(0, 10 * UPDATE_STRETCH_MAX_S, final=False)  # its peer stopped for that long
    waited(ended, GRACE_S + UPDATE_STRETCH_MAX_S - 1)
    assert not done(ended)
    waited(ended, GRACE_S + UPDATE_STRETCH_MAX_S + 1)
    assert done(ended)


def test_a_run_that_gives_up_says_what_it_is_done_without(ended: RunEnd, caplog: pytest.LogCaptureFixture) -> None:
    ended.num_learners = 2
    ended.learner_reported(0, 0.3, final=True)
    with caplog.at_level(logging.WARNING, logger="rlmq.coordinator"):
        assert done(ended)
    assert "without the learners' final weights, the final reports of learner ranks [1]" in caplog.text


def test_the_learners_last_word_ends_the_wait_at_once(ended: RunEnd) -> None:
    ended.learner_reported(0, 20.0, final=False)
    ended.learner_reported(0, 21.0, final=True)
    ended.final_weights = True
    waited(ended, 0.0)
    assert done(ended)
