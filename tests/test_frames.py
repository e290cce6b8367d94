"""Frame stacks taken apart into frames and put back together: on the wire and in replay each frame
travels and is stored once, and every observation comes back exactly as it went in."""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
import torch

from rlmq.actors.collector import Collector
from rlmq.common import envs, wire
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec
from rlmq.learners.frames import FrameRing
from rlmq.learners.networks import ActorCritic, obs_features
from rlmq.learners.replay import Replay
from tests.helpers.references import to_numpy_params

K = 3  # frames per observation
SPEC = EnvSpec(obs_shape=(K, 2, 3), obs_dtype="uint8", action_kind="discrete", action_dim=2**20, frame_stack=K)
ATARI = EnvSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", action_kind="discrete", action_dim=6, frame_stack=4)


def stacked_rollout(steps: int, slots: int, ends: dict[tuple[int, int], bool], seed: int) -> wire.Rollout:
    """A rollout as FrameStackObservation and next-step autoreset make it: each step pushes a new
    random frame onto the slot's stack; an episode ending at step t (`ends[(t, n)]`: True for
    terminated, False for truncated) has its final observation at t + 1, the reset step t + 1 is
    invalid, and the new episode's stack at t + 2 repeats its first frame (gymnasium's "reset"
    padding). The action of step t in slot n is t·slots + n, so a sample says where it came from."""
    rng = np.random.default_rng(seed)
    obs = np.zeros((steps + 1, slots, K, 2, 3), np.uint8)
    valid = np.ones((steps, slots), bool)
    terminated, truncated = np.zeros((steps, slots), bool), np.zeros((steps, slots), bool)
    for n in range(slots):
        stack = np.repeat(rng.integers(0, 256, (1, 2, 3), np.uint8), K, axis=0)
        for t in range(steps + 1):
            if t > 0 and ends.get((t - 2, n)) is not None:  # the reset step's new episode
                stack = np.repeat(rng.integers(0, 256, (1, 2, 3), np.uint8), K, axis=0)
            elif t > 0:
                stack = np.concatenate([stack[1:], rng.integers(0, 256, (1, 2, 3), np.uint8)])
            obs[t, n] = stack
        for (t, slot), real in ends.items():
            if slot == n:
                terminated[t, n], truncated[t, n] = real, not real
                if t + 1 < steps:
                    valid[t + 1, n] = False
    return wire.Rollout(
        member=0,
        policy_version=1,
        actor="a0",
        obs=obs,
        actions=(np.arange(steps)[:, None] * slots + np.arange(slots)).astype(np.int64),
        logprobs=np.zeros((steps, slots), np.float32),
        rewards=rng.random((steps, slots), np.float32),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
    )


def assert_sampled_as_stored(replay: Replay, rollouts: list[wire.Rollout], draws: int = 3000) -> None:
    """Every sampled transition's observations equal the rollout's own (t, and t + horizon)."""
    batch, active = replay.sample(draws, np.random.default_rng(1), torch.device("cpu"))
    assert active.all()
    by_action = {
        int(rollout.actions[t, n]): (rollout, int(t), int(n))
        for rollout in rollouts
        for t, n in zip(*np.nonzero(rollout.valid), strict=True)
    }
    for i in range(draws):
        rollout, t, n = by_action[int(batch.actions[0, i])]
        horizon = int(batch.horizon[0, i])
        torch.testing.assert_close(batch.obs[0, i], obs_features(torch.from_numpy(rollout.obs[t, n]), SPEC))
        torch.testing.assert_close(
            batch.next_obs[0, i], obs_features(torch.from_numpy(rollout.obs[t + horizon, n]), SPEC)
        )


@pytest.mark.parametrize("n_step", [1, 3])
def test_stacked_observations_come_back_exactly_and_each_frame_is_stored_once(n_step: int) -> None:
    steps, slots = 12, 3
    ends = {(3, 0): True, (7, 1): False, (10, 0): True}
    rollout = stacked_rollout(steps, slots, ends, seed=0)
    replay = Replay(1, 1000, SPEC, n_step=n_step)
    assert replay.add_rollout(0, rollout, gamma=0.9) == int(rollout.valid.sum())
    assert_sampled_as_stored(replay, [rollout])
    # Each slot's first observation takes K rows, each new episode's K, every other observation
    # one: its newest frame.
    new_episodes = sum(1 for t, _ in ends if t + 2 <= steps)
    assert replay.frames.written(0) == slots * (steps + 1) + (K - 1) * (slots + new_episodes)


def test_a_frame_ring_that_wraps_drops_the_transitions_it_no_longer_holds() -> None:
    """A ring of 40 rows (each rollout writes 3 × (K − 1) + 3 × 9 = 33): the oldest transitions go
    before the ring of transitions is full, and no sample ever shows a half-overwritten stack."""
    replay = Replay(1, 30, SPEC)
    replay.frames = FrameRing(1, 40, SPEC)
    # Rollout r's action codes start at 1000·r, so that a sample says which rollout it came from.
    rollouts = [
        dataclasses.replace(rollout, actions=rollout.actions + 1000 * r)
        for r, rollout in enumerate(stacked_rollout(8, 3, {}, seed=s) for s in range(3))
    ]
    for rollout in rollouts:
        replay.add_rollout(0, rollout)
        assert replay.size(0) == (24 if rollout is rollouts[0] else 28)
    # After the last: 40 rows hold the last rollout's 33 and the 7 before, of which slot 2's
    # observations from step 4 on are whole; 30 transitions were kept, 2 of them point further back.
    batch, _ = replay.sample(2000, np.random.default_rng(2), torch.device("cpu"))
    assert set((batch.actions[0] // 1000).tolist()) == {1, 2}
    assert set((batch.actions[0][batch.actions[0] < 2000] % 1000).tolist()) == {t * 3 + 2 for t in range(4, 8)}
    assert_sampled_as_stored(replay, rollouts[1:])


def test_an_atari_replay_of_100k_transitions_is_well_under_a_gibibyte() -> None:
    """The issue's bound: a frame per transition and 1/8 more, 84 × 84 bytes each (0.74 GiB; whole
    stacks for obs and next_obs would take 5.3 GiB)."""
    replay = Replay(1, 100_000, ATARI)
    assert replay.frames.nbytes / 2**30 < 0.75
    assert replay.frames.nbytes == (int(100_000 * 1.125) + 4) * 84 * 84


def test_frame_stacks_on_the_wire_are_the_envs_own_across_episode_ends_and_rollouts() -> None:
    """A stacked env through the Collector: two rollouts (the second goes on from the first's
    slots) over several 16-step episodes, each sent with every frame once, decode to exactly the
    stacks the env gave, in under half the bytes of the whole stacks."""
    env_id = "pixel_bandit:StackedPixelBandit"  # tests/helpers is on the path (conftest.py)
    env = envs.make_vector_env(env_id, 3)
    spec = envs.describe(env, env_id)
    assert spec.frame_stack == 4 and spec.obs_shape == (4, 6, 6, 2)
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (8,))), spec)
    collector = Collector(env, spec, 20, seed=3)
    for _ in range(2):
        rollout = collector.collect(policy, member=0, version=0, actor="a")
        assert rollout.frame_stack == 4 and (~rollout.valid).any(), "no episode ended within the rollout"
        frame = wire.encode(rollout)
        whole = wire.encode(dataclasses.replace(rollout, frame_stack=1))
        decoded = wire.decode(frame)
        assert isinstance(decoded, wire.Rollout) and decoded.obs.dtype == np.uint8
        np.testing.assert_array_equal(decoded.obs, rollout.obs)
        assert len(frame) < 0.5 * len(whole), (len(frame), len(whole))
    env.close()


def hostile(rollout: wire.Rollout, **changes: object) -> bytes:
    """The frame of `rollout` sent with frame rows and keys, with its packed fields changed."""
    version, kind, fields = msgpack.unpackb(wire.encode(rollout), raw=False)
    for name, value in changes.items():
        fields[name] = value
    return msgpack.packb([version, kind, fields], use_bin_type=True)


def test_frame_keys_that_name_rows_not_sent_or_too_many_bytes_are_wire_errors() -> None:
    rollout = stacked_rollout(6, 2, {}, seed=4)
    rollout = dataclasses.replace(rollout, frame_stack=K)
    _, _, fields = msgpack.unpackb(wire.encode(rollout), raw=False)
    rows = fields["obs"][1][0]
    keys = np.frombuffer(fields["frame_keys"][2], np.int32).reshape(fields["frame_keys"][1])
    cases = {
        "bad_value": [
            hostile(rollout, frame_keys=["int32", [2, 7], (keys + rows).astype(np.int32).tobytes()]),
            hostile(rollout, frame_keys=["int32", [2, 7], np.zeros((2, 7), np.int32).tobytes()]),
            hostile(rollout, frame_stack=True),
        ],
        "bad_shape": [hostile(rollout, frame_keys=["float32", [2, 7], keys.astype(np.float32).tobytes()])],
        # 4 M keys that all name the last stack: 16 MB to send, 72 MB of stacks to rebuild.
        "too_large": [
            hostile(rollout, frame_keys=["int32", [4, 10**6], np.full((4, 10**6), rows - 1, np.int32).tobytes()])
        ],
    }
    for reason, frames in cases.items():
        for frame in frames:
            with pytest.raises(wire.WireError) as error:
                wire.decode(frame)
            assert error.value.reason == reason, (reason, error.value)
