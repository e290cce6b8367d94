"""The coordinator's Redis schema against a real Redis server."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from rlmq.common import wire
from rlmq.common.config import PPOConfig, RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.coordinator.store import RECENT_EPISODES, RunStore


@pytest.fixture
def store(redis_client: redis.Redis, run_id: str) -> RunStore:
    return RunStore(redis_client, run_id)


def test_config_round_trips(store: RunStore) -> None:
    config = RunConfig(env_id="Pendulum-v1", target_return=-200.0, hidden_sizes=(32, 16),
                       ppo=PPOConfig(learning_rate=3e-4, epochs=7))
    spec = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=1, action_low=(-2.0,), action_high=(2.0,))
    assert store.load_config() is None
    store.save_config(config, spec)
    assert store.load_config() == (config, spec)


def test_recent_returns_keep_the_newest_hundred(store: RunStore) -> None:
    for start in range(0, 250, 50):
        counted, steps, recent = store.add_actor_report("actor-0", 0, 50, [float(v) for v in range(start, start + 50)])
        assert counted and steps == start + 50 and recent == store.recent_returns(0)
    assert len(recent) == RECENT_EPISODES
    assert recent[0] == 249.0 and recent[-1] == 150.0
    assert store.status().episodes == 250


def test_each_report_of_an_actor_session_is_counted_once(store: RunStore) -> None:
    """A report sent again (the coordinator restarted before acknowledging it) is not counted twice;
    a restarted actor process (another session) starts its sequence anew; sequence 0 always counts."""
    assert store.add_actor_report("actor-0", 0, 10, [1.0], session=7, sequence=1) == (True, 10, [1.0])
    assert store.add_actor_report("actor-0", 0, 10, [1.0], session=7, sequence=1) == (False, 10, [])
    assert store.add_actor_report("actor-0", 0, 5, [], session=7, sequence=2)[:2] == (True, 15)
    assert store.add_actor_report("actor-0", 0, 5, [], session=7, sequence=2)[:2] == (False, 15)
    assert store.add_actor_report("actor-0", 0, 3, [2.0], session=8, sequence=1) == (True, 18, [2.0, 1.0])
    assert store.add_actor_report("actor-1", 0, 2, [], session=7, sequence=1)[:2] == (True, 20)  # its own sequence
    assert [store.add_actor_report("actor-1", 0, 1, [])[:2] for _ in range(2)] == [(True, 21), (True, 22)]
    assert store.status().episodes == 2 and store.member_steps() == {0: 22}


def test_weights_are_stored_as_validated_frames(store: RunStore, redis_client: redis.Redis) -> None:
    weights = wire.Weights(member=0, version=3, params={"policy.0.weight": np.ones((2, 4), np.float32)})
    store.put_weights_frame(0, wire.encode(weights))
    loaded = store.weights(0)
    assert loaded is not None and loaded.version == 3
    assert np.array_equal(loaded.params["policy.0.weight"], weights.params["policy.0.weight"])
    redis_client.set(store.key("weights", 0), b"\x80\x04 a pickle header, not a frame")
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
