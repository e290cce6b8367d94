"""The coordinator's Redis schema against a real Redis server."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from rlmq.actors.unacked import UnackedEpisodes
from rlmq.common import wire
from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.records import LearnerRecord, ProgressSample
from rlmq.coordinator.store import RECENT_EPISODES, RunStore


@pytest.fixture
def store(redis_client: redis.Redis, run_id: str) -> RunStore:
    return RunStore(redis_client, run_id)


def deliver(store: RunStore, steps: dict[str, int], episodes: dict[str, int], session: int = 1) -> None:
    """A learner's report of deliveries since its last one, as a learner sends them: the totals."""
    totals = _delivered.setdefault((store.prefix, session), ({}, {}))
    for kind, counts in enumerate((steps, episodes)):
        for name, count in counts.items():
            totals[kind][name] = totals[kind].get(name, 0) + count
    store.add_deliveries(session, *totals)


_delivered: dict[tuple[str, int], tuple[dict[str, int], dict[str, int]]] = {}


def test_config_round_trips(store: RunStore) -> None:
    config = RunConfig(
        env_id="Pendulum-v1", target_return=-200.0, hidden_sizes=(32, 16), ppo=PPOConfig(learning_rate=3e-4, epochs=7)
    )
    spec = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=1, action_low=(-2.0,), action_high=(2.0,))
    assert store.load_config() is None
    store.save_config(config, spec)
    assert store.load_config() == (config, spec)


def test_recent_returns_keep_the_newest_hundred(store: RunStore) -> None:
    for start in range(0, 250, 50):
        added, episodes, steps, recent, *_ = store.add_actor_report(
            "actor-0", 0, 50, [float(v) for v in range(start, start + 50)]
        )
        assert (added, episodes, steps) == (50, 50, start + 50) and recent == store.recent_returns(0)
    assert len(recent) == RECENT_EPISODES
    assert recent[0] == 249.0 and recent[-1] == 150.0
    assert store.status().episodes == 250


def test_an_actor_sessions_totals_count_each_step_and_episode_once(store: RunStore) -> None:
    """A report repeated (the coordinator restarted before acknowledging it), lost or overtaken
    adds nothing twice: what counts is what the session's totals add. Its returns are the last of
    its episodes, the ones not yet acknowledged. Another session (a restarted actor process) starts
    from nothing; a report without one counts as it is."""

    def report(
        actor: str, steps: int, returns: list[float], session: int, steps_total: int, episodes_total: int
    ) -> tuple[int, int, int, list[float]]:
        counted = store.add_actor_report(actor, 0, steps, returns, session, steps_total, episodes_total)
        assert counted.uncounted == 0  # unchecked: everything heard is counted
        return counted[:4]

    assert report("actor-0", 10, [1.0], 7, 10, 1) == (10, 1, 10, [1.0])
    assert report("actor-0", 10, [1.0], 7, 10, 1) == (0, 0, 10, [])  # the same report again
    # the next report was lost; this one carries its episode too, since neither was acknowledged
    assert report("actor-0", 5, [2.0, 3.0], 7, 20, 3) == (10, 2, 20, [3.0, 2.0, 1.0])
    assert report("actor-0", 5, [2.0], 7, 15, 2)[:3] == (0, 0, 20)  # overtaken: counted already
    assert report("actor-0", 4, [9.0], 8, 4, 1)[:3] == (4, 1, 24)  # a new process
    assert report("actor-1", 1, [], 7, 1, 0)[:3] == (1, 0, 25)  # another actor: its own totals
    assert [report("actor-1", 1, [], 0, 0, 0)[:3] for _ in range(2)] == [(1, 0, 26), (1, 0, 27)]
    assert store.status().episodes == 4 and store.member_steps() == {0: 27}


def test_a_checked_report_counts_no_more_than_the_learners_took(store: RunStore) -> None:
    """On a secure run an actor's claims count only as far as the learners have taken its rollouts:
    a claim of a million steps and a hundred episodes of return 500 with one short rollout behind
    it counts that rollout; the rest waits, and counts when (and as far as) deliveries catch up.
    A new session (a restarted actor, or one that says so) starts no fresh allowance."""

    def report(session: int, steps_total: int, episodes_total: int, returns: list[float]) -> tuple[int, int]:
        added = store.add_actor_report("actor-0", 0, 0, returns, session, steps_total, episodes_total, checked=True)
        return added[0], added[1]

    assert report(1, 10**6, 100, [500.0] * 100) == (0, 0)  # nothing delivered yet
    deliver(store, {"actor-0": 32, "actor-1": 8}, {"actor-0": 2})
    assert report(1, 10**6, 100, [500.0] * 100) == (32, 2)
    assert store.recent_returns(0) == [500.0, 500.0]  # as many returns as counted episodes
    deliver(store, {"actor-0": 64}, {"actor-0": 1})
    assert report(1, 10**6, 100, [500.0] * 100) == (64, 1)
    assert report(2, 10**6, 100, [500.0] * 100) == (0, 0)  # another session: no new allowance
    assert store.status().env_steps == 96 and store.status().episodes == 3
    # A restarted actor's new session leaves nothing of the old one's claims behind: what its
    # predecessor claimed and delivered late counts at the new session's next report.
    deliver(store, {"actor-2": 60}, {"actor-2": 1})
    assert store.add_actor_report("actor-2", 0, 0, [], 1, 100, 2, checked=True)[:2] == (60, 1)
    deliver(store, {"actor-2": 40 + 50}, {"actor-2": 1 + 1})
    assert store.add_actor_report("actor-2", 0, 0, [7.0], 2, 50, 1, checked=True)[:2] == (90, 2)
    # An honest actor's claims, deferred, are all counted once deliveries cover them.
    deliver(store, {"actor-1": 40}, {"actor-1": 3})
    assert store.add_actor_report("actor-1", 0, 0, [1.0, 2.0], 5, 100, 5, checked=True)[:2] == (48, 3)
    deliver(store, {"actor-1": 52}, {"actor-1": 2})
    assert store.add_actor_report("actor-1", 0, 0, [3.0], 5, 100, 5, checked=True)[:2] == (52, 2)
    assert store.add_actor_report("actor-1", 0, 0, [], 5, 100, 5, checked=True)[:2] == (0, 0)


def test_delivered_totals_count_once_whatever_reports_are_lost_repeated_or_overtaken(store: RunStore) -> None:
    """A learner's deliveries come as totals of its process: a report dropped on a full socket (the
    coordinator cut off) is made good by the next, a repeated or overtaken one adds nothing, and
    another process (a restarted learner, another rank) adds its own."""

    def tally(name: str) -> tuple[int, int]:
        counts = store.tally(name)
        return counts.get("delivered_steps", 0), counts.get("delivered_episodes", 0)

    store.add_deliveries(7, {"actor-0": 64, "actor-1": 32}, {"actor-0": 1})
    # the reports of 128 and 192 were lost; the next says all
    store.add_deliveries(7, {"actor-0": 256}, {"actor-0": 4})
    store.add_deliveries(7, {"actor-0": 256}, {"actor-0": 4})  # repeated
    store.add_deliveries(7, {"actor-0": 192, "actor-1": 32}, {"actor-0": 3})  # overtaken
    assert tally("actor-0") == (256, 4) and tally("actor-1") == (32, 0)
    store.add_deliveries(8, {"actor-0": 64}, {"actor-0": 2})  # another learner process
    assert tally("actor-0") == (320, 6) and tally("actor-1") == (32, 0)


def test_a_checked_actor_resends_the_returns_of_episodes_not_yet_counted(store: RunStore) -> None:
    """An actor waiting for credit reports nothing new while the learner takes its last rollout and
    says so; the report after, with the next rollout's episodes, comes before the learner has
    taken that one. Each report then finds nothing to count among the returns it carries, and the
    member's record would keep its first returns for the whole run. The acknowledgement names the
    episodes not yet counted, the actor sends their returns again, and each counts once, in order."""
    unacked, totals, session = UnackedEpisodes(4096), [0, 0], 3

    def report(new_returns: list[float], steps: int) -> list[float]:
        """One report of the actor (actors/actor.py) and its acknowledgement; the returns pushed."""
        before = store.recent_returns(0)
        totals[0] += steps
        totals[1] += len(new_returns)
        unacked.add(np.array(new_returns), np.full(len(new_returns), 10))
        counted = store.add_actor_report("actor-0", 0, steps, unacked.returns.tolist(), session, *totals, checked=True)
        ack = wire.ReportAck(steps_total=totals[0], episodes_total=totals[1], episodes_uncounted=counted.uncounted)
        unacked.keep_newest(totals[1] - ack.episodes_total + ack.episodes_uncounted)
        pushed = store.recent_returns(0)
        return pushed[: len(pushed) - len(before)][::-1]  # oldest first

    for rollout in range(3):
        episode_returns = [10.0 * rollout + 1, 10.0 * rollout + 2]
        assert report(episode_returns, 64) == []  # claimed before the learner took the rollout
        deliver(store, {"actor-0": 64}, {"actor-0": 2})
        assert report([], 0) == episode_returns  # counted now, from the returns sent again
        assert len(unacked) == 0
    # Deliveries that cover part of the claims count the oldest first; the rest wait.
    assert report([31.0, 32.0, 33.0], 96) == []
    deliver(store, {"actor-0": 32}, {"actor-0": 1})
    assert report([], 0) == [31.0] and unacked.returns.tolist() == [32.0, 33.0]
    deliver(store, {"actor-0": 64}, {"actor-0": 2})
    assert report([41.0], 32) == [32.0, 33.0]
    assert store.status().episodes == 9 and unacked.returns.tolist() == [41.0]


def test_learner_records_and_progress_samples_come_back_typed_and_a_bad_one_names_its_field(
    store: RunStore, redis_client: redis.Redis
) -> None:
    rank_1 = LearnerRecord("l1", "tcp://10.0.0.7:5601", 4242, 9101, "learner-1")
    store.put_learner(1, rank_1)
    sample = ProgressSample(time=1.5, env_steps=2_048, episodes=3, mean_return=None, members={"0": None, "1": 20.5})
    store.append_progress(sample)
    assert store.learners() == {1: rank_1} and store.progress() == [sample]
    bad = '{"name": "l0", "endpoint": 5601, "pid": 1, "metrics_port": 0, "identity": "l0"}'  # Redis is not trusted
    redis_client.hset(store.key("learners"), "0", bad)
    with pytest.raises(ValueError, match="endpoint"):
        store.learners()
    redis_client.rpush(store.key("progress"), '{"time": 2.0, "env_steps": "many"}')
    with pytest.raises(ValueError, match="env_steps"):
        store.progress()


def test_weights_are_stored_as_validated_frames(store: RunStore, redis_client: redis.Redis) -> None:
    weights = wire.Weights(member=0, version=3, params={"policy.0.weight": np.ones((2, 4), np.float32)})
    store.put_encoded_weights(0, wire.encode(weights))
    loaded = store.weights(0)
    assert loaded is not None and loaded.version == 3
    assert np.array_equal(loaded.params["policy.0.weight"], weights.params["policy.0.weight"])
    redis_client.set(store.key("weights", 0), b"\x80\x04 a pickle header, not a message")
    with pytest.raises(wire.WireError):
        store.weights(0)


def test_keys_live_under_the_run_prefix(store: RunStore, redis_client: redis.Redis, run_id: str) -> None:
    store.set_status(state="running")
    store.add_actor_report("actor-0", 0, 10, [])
    assert store.status().env_steps == 10 and store.member_steps() == {0: 10}
    keys = {k.decode() for k in redis_client.scan_iter(match=f"rlmq:{run_id}:*")}
    assert keys == {f"rlmq:{run_id}:{name}" for name in ("status", "actors", "member_steps")}
    store.delete_run()
    assert not list(redis_client.scan_iter(match=f"rlmq:{run_id}:*"))


def test_actors_silent_for_long_are_forgotten(store: RunStore, redis_client: redis.Redis) -> None:
    now = time.time()
    redis_client.hset(store.key("actors"), mapping={"live": now, "quiet": now - 30, "gone": now - 500})
    assert store.live_actors(timeout_s=10) == 1  # counting alone deletes nothing
    assert redis_client.hlen(store.key("actors")) == 3
    assert store.live_actors(timeout_s=10, forget_after_s=100) == 1
    assert set(redis_client.hkeys(store.key("actors"))) == {b"live", b"quiet"}
