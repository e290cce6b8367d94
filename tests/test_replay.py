"""The per-member replay memory: what goes in comes out, the ring wraps, sampling is uniform."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlmq.common import wire
from rlmq.common.schema import EnvSpec
from rlmq.learners.replay import Replay, Transitions, n_step

OBS_DIM = 4  # obs[t, n] = [tag, t, n, member]: every stored row says where it came from


def sizes(replay: Replay) -> list[int]:
    return [replay.size(m) for m in range(replay.population)]


def spec(obs_dim: int = OBS_DIM, action_dim: int | None = None) -> EnvSpec:
    """Discrete actions (of any index a test encodes), or continuous ones of `action_dim`."""
    if action_dim is None:
        return EnvSpec(obs_shape=(obs_dim,), action_kind="discrete", action_dim=2**20)
    return EnvSpec(obs_shape=(obs_dim,), action_kind="continuous", action_dim=action_dim)


def make_rollout(
    valid: np.ndarray,
    *,
    member: int = 0,
    tag: int = 0,
    terminated: np.ndarray | None = None,
    truncated: np.ndarray | None = None,
    action_dim: int | None = None,
) -> wire.Rollout:
    steps, slots = valid.shape
    t, n = np.meshgrid(np.arange(steps + 1), np.arange(slots), indexing="ij")
    obs = np.stack([np.full_like(t, tag), t, n, np.full_like(t, member)], axis=-1)
    obs = obs.astype(np.float32)
    code = (t[:-1] * slots + n[:-1]).astype(np.int64)  # the action encodes (t, n)
    if action_dim is None:
        actions = code
    else:
        actions = (code[..., None] + np.arange(action_dim) / 10).astype(np.float32)
    return wire.Rollout(
        member=member,
        policy_version=1,
        actor="a0",
        obs=obs,
        actions=actions,
        logprobs=np.zeros((steps, slots), np.float32),
        rewards=(1000 * tag + 10 * t[:-1] + n[:-1] + 0.5).astype(np.float32),
        terminated=np.zeros((steps, slots), bool) if terminated is None else terminated,
        truncated=np.zeros((steps, slots), bool) if truncated is None else truncated,
        valid=valid,
    )


def stored_keys(replay: Replay, member: int, draws: int = 4000) -> set[tuple[int, int, int]]:
    """The (tag, t, n) of every transition a large sample of `member` hits."""
    batch, _ = replay.sample(draws, np.random.default_rng(0), torch.device("cpu"))
    rows = batch.obs[member, :, :3].to(torch.int64).tolist()
    return {(tag, t, n) for tag, t, n in rows}


def test_sample_returns_exactly_the_stored_transitions() -> None:
    steps, slots = 6, 3
    valid = np.ones((steps, slots), bool)
    terminated = np.zeros((steps, slots), bool)
    truncated = np.zeros((steps, slots), bool)
    terminated[1, 0], valid[2, 0] = True, False  # slot 0 ends at t=1, resets at t=2
    truncated[3, 1], valid[4, 1] = True, False  # slot 1 is cut by the time limit at t=3
    valid[0, 2] = False  # slot 2 opens on a reset step
    terminated[4, 2] = truncated[4, 2] = True  # both flags: a real end, no bootstrap
    replay = Replay(1, 100, spec())
    rollout = make_rollout(valid, terminated=terminated, truncated=truncated)

    assert replay.add_rollout(0, rollout) == 15
    assert replay.size(0) == 15 and sizes(replay) == [15]

    batch, active = replay.sample(3000, np.random.default_rng(1), torch.device("cpu"))
    assert active.tolist() == [True]
    seen = set()
    for i in range(3000):
        _, t, n, _ = (int(v) for v in batch.obs[0, i])
        assert valid[t, n], f"invalid step ({t}, {n}) sampled"
        assert batch.next_obs[0, i].tolist() == [0.0, t + 1, n, 0.0]
        assert int(batch.actions[0, i]) == t * slots + n
        assert float(batch.rewards[0, i]) == 10 * t + n + 0.5
        assert float(batch.terminated[0, i]) == float(terminated[t, n])
        seen.add((t, n))
    # Every stored transition comes back.
    assert seen == {(t, n) for t, n in zip(*np.nonzero(valid), strict=True)}
    # Spot checks of the flags: truncation bootstraps (0), termination does not (1).
    expected = {(1, 0): 1.0, (3, 1): 0.0, (4, 2): 1.0, (0, 0): 0.0}
    for (t, n), flag in expected.items():
        rows = (batch.obs[0, :, 1] == t) & (batch.obs[0, :, 2] == n)
        assert rows.any() and set(batch.terminated[0, rows].tolist()) == {flag}


def test_ring_keeps_the_newest_capacity_transitions() -> None:
    replay = Replay(1, 10, spec())
    added: list[tuple[int, int, int]] = []  # (tag, t, n) in arrival order
    valid_masks = [np.ones((7, 1), bool) for _ in range(4)]
    valid_masks[1][3, 0] = False  # 7 + 6 + 7 + 5 = 25 valid transitions
    valid_masks[3][[0, 4], 0] = False
    for tag, valid in enumerate(valid_masks):
        assert replay.add_rollout(0, make_rollout(valid, tag=tag)) == valid.sum()
        added += [(tag, int(t), 0) for t in np.nonzero(valid[:, 0])[0]]
        assert replay.size(0) == min(len(added), 10)
    assert len(added) == 25
    assert stored_keys(replay, 0) == set(added[-10:])

    # One rollout with more valid steps than the capacity keeps its last 10 (here 2 slots: rows
    # arrive slot by slot, each in time order, so the last 10 are steps 2..11 of slot 1).
    assert replay.add_rollout(0, make_rollout(np.ones((12, 2), bool), tag=9)) == 24
    assert replay.size(0) == 10
    assert stored_keys(replay, 0) == {(9, t, 1) for t in range(2, 12)}
    # ... and the ring goes on from there: 3 more push out the 3 oldest.
    replay.add_rollout(0, make_rollout(np.ones((3, 1), bool), tag=10))
    assert stored_keys(replay, 0) == {(9, t, 1) for t in range(5, 12)} | {(10, t, 0) for t in range(3)}


def test_sampling_is_uniform_reproducible_and_per_member() -> None:
    replay = Replay(3, 50, spec())
    replay.add_rollout(0, make_rollout(np.ones((4, 1), bool), member=0))
    replay.add_rollout(1, make_rollout(np.ones((5, 2), bool), member=1, tag=7))
    assert sizes(replay) == [4, 10, 0]

    batch, active = replay.sample(40_000, np.random.default_rng(2), torch.device("cpu"))
    assert active.dtype == torch.bool and active.tolist() == [True, True, False]
    share = torch.bincount(batch.obs[0, :, 1].to(torch.int64), minlength=4) / 40_000
    assert share.shape == (4,) and torch.all((share - 0.25).abs() < 0.02), share
    # Members sample only their own data; the empty member's rows are all zero.
    assert set(batch.obs[0, :, 3].tolist()) == {0.0} and set(batch.obs[0, :, 0].tolist()) == {0.0}
    assert set(batch.obs[1, :, 3].tolist()) == {1.0} and set(batch.obs[1, :, 0].tolist()) == {7.0}
    for field in batch:
        assert not field[2].any()

    again, _ = replay.sample(40_000, np.random.default_rng(2), torch.device("cpu"))
    other, _ = replay.sample(40_000, np.random.default_rng(3), torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(batch, again, strict=True))
    assert not torch.equal(batch.obs, other.obs)


def test_shared_sampling_draws_every_member_from_all_members_transitions() -> None:
    replay = Replay(4, 6, spec(), shared=True)
    replay.add_rollout(0, make_rollout(np.ones((2, 1), bool), member=0, tag=1))
    replay.add_rollout(2, make_rollout(np.ones((4, 2), bool), member=2, tag=3))  # 8 rows wrap to the newest 6
    assert sizes(replay) == [2, 0, 6, 0]
    # Stored slot by slot: slot 0's steps 0 and 1 were the two oldest.
    stored = {(1, t, 0) for t in range(2)} | {(3, t, 0) for t in (2, 3)} | {(3, t, 1) for t in range(4)}

    batch, active = replay.sample(40_000, np.random.default_rng(9), torch.device("cpu"))
    assert active.tolist() == [True, True, True, True]  # members 1 and 3 hold nothing, yet train
    for member in range(4):
        rows = batch.obs[member, :, :3].to(torch.int64).tolist()
        keys = [(tag, t, n) for tag, t, n in rows]
        assert set(keys) == stored  # every stored transition, nothing else, whoever stored it
        # Uniform over the 8 transitions together, so member 0's two are a quarter of the draws.
        assert abs(sum(key[0] == 1 for key in keys) / 40_000 - 0.25) < 0.02
    # A transition comes out whole: its action and next observation are the same step's.
    code = batch.obs[..., 1] * 2 + batch.obs[..., 2]
    from_member_0 = batch.obs[..., 0] == 1
    assert torch.equal(batch.actions[~from_member_0].double(), code[~from_member_0].double())
    assert torch.equal(batch.next_obs[..., 1], batch.obs[..., 1] + 1)
    assert torch.equal(batch.next_obs[..., 3], batch.obs[..., 3])

    empty = Replay(3, 8, spec(), shared=True)
    batch, active = empty.sample(16, np.random.default_rng(8), torch.device("cpu"))
    assert active.tolist() == [False, False, False] and all(not field.any() for field in batch)


def test_members_draw_independently() -> None:
    replay = Replay(2, 8, spec())
    for member in range(2):
        replay.add_rollout(member, make_rollout(np.ones((4, 1), bool), member=member))
    batch, _ = replay.sample(20_000, np.random.default_rng(7), torch.device("cpu"))
    # Same data, independent draws: the two members pick the same step a quarter of the time.
    agree = (batch.obs[0, :, 1] == batch.obs[1, :, 1]).double().mean().item()
    assert abs(agree - 0.25) < 0.02, agree


def test_copy_member_gives_the_target_an_independent_copy() -> None:
    replay = Replay(2, 8, spec())
    replay.add_rollout(0, make_rollout(np.ones((3, 2), bool), member=0, tag=1))
    replay.add_rollout(1, make_rollout(np.ones((5, 1), bool), member=1, tag=2))
    source_before = stored_keys(replay, 0)

    replay.copy_member(0, 1)
    assert sizes(replay) == [6, 6]
    batch, _ = replay.sample(2000, np.random.default_rng(4), torch.device("cpu"))
    assert set(batch.obs[1, :, 3].tolist()) == {0.0}  # member 0's rows, not member 1's own
    assert stored_keys(replay, 1) == source_before

    # The target keeps writing from the copied position; the source does not change.
    replay.add_rollout(1, make_rollout(np.ones((4, 1), bool), member=1, tag=3))
    assert sizes(replay) == [6, 8]
    assert stored_keys(replay, 0) == source_before
    # The two oldest of the source's, stored slot by slot: steps 0 and 1 of slot 0.
    assert stored_keys(replay, 1) == (source_before - {(1, 0, 0), (1, 1, 0)}) | {(3, t, 0) for t in range(4)}

    # Copying an empty member empties the target: inactive, zero rows.
    empty = Replay(3, 8, spec())
    empty.add_rollout(0, make_rollout(np.ones((3, 1), bool), member=0, tag=5))
    empty.copy_member(2, 0)
    batch, active = empty.sample(16, np.random.default_rng(8), torch.device("cpu"))
    assert sizes(empty) == [0, 0, 0] and active.tolist() == [False, False, False]
    assert all(not field.any() for field in batch)


def test_action_shapes_and_dtypes() -> None:
    discrete = Replay(2, 16, spec())
    discrete.add_rollout(0, make_rollout(np.ones((3, 2), bool)))
    batch, _ = discrete.sample(5, np.random.default_rng(5), torch.device("cpu"))
    assert isinstance(batch, Transitions)
    assert batch.actions.shape == (2, 5) and batch.actions.dtype == torch.int64
    assert batch.obs.shape == batch.next_obs.shape == (2, 5, OBS_DIM)
    assert batch.obs.dtype == batch.next_obs.dtype == torch.float32
    for field in (batch.rewards, batch.terminated):
        assert field.shape == (2, 5) and field.dtype == torch.float32

    continuous = Replay(2, 16, spec(action_dim=3))
    continuous.add_rollout(1, make_rollout(np.ones((3, 2), bool), member=1, action_dim=3))
    batch, active = continuous.sample(64, np.random.default_rng(6), torch.device("cpu"))
    assert active.tolist() == [False, True]
    assert batch.actions.shape == (2, 64, 3) and batch.actions.dtype == torch.float32
    code = batch.obs[1, :, 1] * 2 + batch.obs[1, :, 2]  # t * slots + n
    expected = code[:, None] + torch.tensor([0.0, 0.1, 0.2])
    assert torch.allclose(batch.actions[1], expected)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Replay(1, 0, spec())
    replay = Replay(2, 4, spec())
    rollout = make_rollout(np.ones((2, 1), bool))
    with pytest.raises(ValueError, match="member 2 out of range"):
        replay.add_rollout(2, rollout)
    with pytest.raises(ValueError, match="member -1 out of range"):
        replay.size(-1)
    with pytest.raises(ValueError, match="out of range"):
        replay.copy_member(0, 5)
    with pytest.raises(ValueError, match="obs"):
        Replay(1, 4, spec(OBS_DIM + 1)).add_rollout(0, rollout)
    with pytest.raises(ValueError, match="actions"):
        Replay(1, 4, spec(action_dim=2)).add_rollout(0, rollout)


def n_step_reference(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step by step, as the textbook defines it: add γ^j r[t + j] until n rewards, the episode's
    end (that step included) or the rollout's end."""
    steps, slots = rewards.shape
    returns, horizon, ended = np.zeros((steps, slots)), np.zeros((steps, slots), int), np.zeros((steps, slots), bool)
    for t in range(steps):
        for i in range(slots):
            for j in range(n):
                if t + j == steps:
                    break
                returns[t, i] += gamma**j * rewards[t + j, i]
                horizon[t, i], ended[t, i] = j + 1, terminated[t + j, i]
                if terminated[t + j, i] or truncated[t + j, i]:
                    break
    return returns, horizon, ended


@pytest.mark.parametrize("n", [1, 3, 40])  # 40: longer than the rollout
def test_n_step_returns_equal_the_step_by_step_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    rewards = rng.standard_normal((32, 6)).astype(np.float32)
    terminated, truncated = rng.random((32, 6)) < 0.1, rng.random((32, 6)) < 0.05
    got = n_step(rewards, terminated, truncated, 0.9, n)
    want = n_step_reference(rewards, terminated, truncated, 0.9, n)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    if n == 1:  # one step is the plain transition
        assert np.array_equal(got[0], rewards) and (got[1] == 1).all() and np.array_equal(got[2], terminated)


def test_n_step_transitions_bootstrap_from_obs_k_steps_on_and_stop_at_an_episode_end() -> None:
    """Slot 0 terminates at t = 1 (reset at t = 2), slot 1 is truncated at t = 2; three steps each
    at most, discounted by 0.5. make_rollout's obs hold their own t, its rewards 10·t + n + 0.5."""
    steps, slots = 5, 2
    valid, terminated, truncated = (
        np.ones((steps, slots), bool),
        np.zeros((steps, slots), bool),
        np.zeros((steps, slots), bool),
    )
    terminated[1, 0], valid[2, 0] = True, False
    truncated[2, 1], valid[3, 1] = True, False
    replay = Replay(1, 100, spec(), n_step=3)
    assert replay.add_rollout(0, make_rollout(valid, terminated=terminated, truncated=truncated), gamma=0.5) == 8
    batch, _ = replay.sample(2000, np.random.default_rng(0), torch.device("cpu"))
    got = {
        (int(o[1]), int(o[2])): (float(r), int(nxt[1]), float(k), float(d))
        for o, r, nxt, k, d in zip(
            batch.obs[0], batch.rewards[0], batch.next_obs[0], batch.horizon[0], batch.terminated[0], strict=True
        )
    }
    r = lambda t, n: 10 * t + n + 0.5  # noqa: E731
    assert got == {
        # (t, slot): (return, t of next_obs, k, terminated)
        (0, 0): (r(0, 0) + 0.5 * r(1, 0), 2, 2, 1.0),  # stops after the terminal step
        (1, 0): (r(1, 0), 2, 1, 1.0),
        (3, 0): (r(3, 0) + 0.5 * r(4, 0), 5, 2, 0.0),  # the rollout ends
        (4, 0): (r(4, 0), 5, 1, 0.0),
        (0, 1): (r(0, 1) + 0.5 * r(1, 1) + 0.25 * r(2, 1), 3, 3, 0.0),
        (1, 1): (r(1, 1) + 0.5 * r(2, 1), 3, 2, 0.0),  # truncated: bootstraps from the final obs
        (2, 1): (r(2, 1), 3, 1, 0.0),
        (4, 1): (r(4, 1), 5, 1, 0.0),
    }
