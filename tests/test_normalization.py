"""Running normalization: statistics merged across actors and ranks equal NumPy's over all the
data, travel inside the weights (checkpoints, actors, evaluation), and PPO's reward scale follows
each actor slot's discounted return."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import norm_rank
import numpy as np
import pytest
import torch

from rlmq.common.algorithms import DQNConfig
from rlmq.common.config import RunConfig
from rlmq.common.models import NumpyPolicy, make_policy
from rlmq.common.schema import OBS_NORM_KEYS
from rlmq.common.transport import free_port
from rlmq.common.wire import Rollout
from rlmq.learners.normalization import ObsNormalizer, RewardScaler, stacked_observations
from rlmq.learners.trainers import make_trainer

HELPER = Path(norm_rank.__file__)
CPU = torch.device("cpu")


def all_valid_observations(member: int, ranks: int) -> np.ndarray:
    rows = [
        r.obs[:-1][r.valid].reshape(-1, norm_rank.SPEC.obs_size)
        for rank in range(ranks)
        for update in range(norm_rank.UPDATES)
        for r in norm_rank.per_member(rank, update)[member]
    ]
    return np.concatenate(rows).astype(np.float64)


def test_statistics_merged_over_two_ranks_equal_numpy_over_all_actors_data(tmp_path: Path) -> None:
    port, world = free_port(), 2
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, str(HELPER), str(r), str(world), str(port), str(outs[r])])
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    a, b = (torch.load(o, weights_only=True) for o in outs)
    for name in ("mean", "var", "count"):
        assert torch.equal(a[name], b[name]), f"{name} differs between ranks"
    for member in range(norm_rank.POPULATION):
        data = all_valid_observations(member, world)
        assert int(a["count"][member]) == len(data) > 0
        np.testing.assert_allclose(a["mean"][member].numpy(), data.mean(0), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(a["var"][member].numpy(), data.var(0), rtol=1e-9, atol=1e-9)


def test_statistics_travel_in_the_weights_and_the_actors_policy_applies_them() -> None:
    """A trainer publishes its statistics with the weights; a fresh trainer (a restarted world, or
    a checkpoint) takes them back; the actors' NumPy policy normalizes exactly as the learner."""
    spec = norm_rank.SPEC
    run_config = RunConfig(
        num_envs=norm_rank.SLOTS,
        rollout_length=norm_rank.STEPS,
        population=2,
        normalize_obs=True,
        obs_clip=3.0,
        hidden_sizes=(8,),
    )
    trainer = make_trainer(spec, run_config, (), 0, 1, CPU)
    trainer.set_hyperparams([run_config.base_hyperparams()] * 2)
    rollouts = norm_rank.per_member(0, 0)
    trainer.train([rollouts[0][:1], []], [int(rollouts[0][0].valid.sum()), 0], 1)
    params = trainer.member_params(0)
    data = rollouts[0][0].obs[:-1][rollouts[0][0].valid].reshape(-1, spec.obs_size).astype(np.float64)
    np.testing.assert_allclose(params["obs_norm.mean"], data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(params["obs_norm.var"], data.var(0), rtol=1e-5)
    assert float(params["obs_norm.clip"]) == 3.0 and int(params["obs_norm.count"]) == len(data)
    idle = trainer.member_params(1)  # member 1 had no data: the identity's statistics
    np.testing.assert_array_equal(idle["obs_norm.mean"], np.zeros(spec.obs_size))
    np.testing.assert_array_equal(idle["obs_norm.var"], np.ones(spec.obs_size))
    assert float(idle["obs_norm.count"]) == 0 and float(idle["obs_norm.clip"]) == 3.0

    restarted = make_trainer(spec, run_config, (), 0, 1, CPU)
    restarted.load_member(0, params)
    assert all(np.array_equal(restarted.member_params(0)[k], params[k]) for k in params)

    obs = rollouts[0][0].obs[0] * 3  # [N, 2, 3], some features beyond the clip
    learner_view = trainer.obs_norm(  # type: ignore[attr-defined]
        torch.from_numpy(obs.reshape(1, len(obs), -1)).expand(2, -1, -1)
    )[0]
    normalized = NumpyPolicy(params, spec).norm(obs.reshape(len(obs), -1))  # type: ignore[misc]
    np.testing.assert_array_equal(learner_view.numpy(), normalized)  # bit for bit: actors act as the learner trained
    assert np.abs(normalized).max() == 3.0
    net = trainer.core  # type: ignore[attr-defined]
    with torch.no_grad():
        expected = net.mlp(net.linear_names("policy"), torch.from_numpy(normalized).float().expand(2, -1, -1))[
            0
        ].numpy()
    np.testing.assert_allclose(NumpyPolicy(params, spec).forward(obs), expected, rtol=1e-4, atol=1e-5)


def test_without_normalization_the_weights_carry_no_statistics() -> None:
    run_config = RunConfig(hidden_sizes=(8,))
    trainer = make_trainer(norm_rank.SPEC, run_config, (), 0, 1, CPU)
    assert not set(OBS_NORM_KEYS) & set(trainer.member_params(0))


def test_weights_whose_statistics_do_not_fit_the_run_are_refused() -> None:
    """What the coordinator checks before it stores published weights, and an actor before it acts."""
    spec = norm_rank.SPEC
    normalizing = RunConfig(normalize_obs=True, hidden_sizes=(8,))
    params = make_trainer(spec, normalizing, (), 0, 1, CPU).member_params(0)
    make_policy(normalizing, params, spec)  # as published: fits
    bare = {k: v for k, v in params.items() if k not in OBS_NORM_KEYS}
    broken = [
        (normalizing, bare, "without observation statistics"),
        (RunConfig(hidden_sizes=(8,)), params, "with observation statistics"),
        (normalizing, {**params, "obs_norm.mean": np.zeros(5, np.float32)}, "do not fit"),
        (normalizing, {**params, "obs_norm.clip": np.array(0.0, np.float32)}, "clip > 0"),
        (normalizing, {k: v for k, v in params.items() if k != "obs_norm.count"}, "need all of"),
    ]
    for run, weights, words in broken:
        with pytest.raises(ValueError, match=words):
            make_policy(run, weights, spec)


def test_off_policy_statistics_move_the_version_before_the_member_trains() -> None:
    """Replay keeps raw observations; the statistics still follow every rollout, and a member whose
    statistics moved counts as updated (a new version), though it has not reached learning_starts."""
    spec = norm_rank.SPEC
    run_config = RunConfig(
        algo="dqn",
        num_envs=norm_rank.SLOTS,
        rollout_length=norm_rank.STEPS,
        population=2,
        normalize_obs=True,
        dqn=DQNConfig(hidden_sizes=(8,), learning_starts=10_000),
    )
    trainer = make_trainer(spec, run_config, (), 0, 1, CPU)
    trainer.set_hyperparams([run_config.base_hyperparams()] * 2)
    rollouts = norm_rank.per_member(0, 0)
    samples = [sum(int(r.valid.sum()) for r in member) for member in rollouts]
    _, updated = trainer.train(rollouts, samples, max(len(member) for member in rollouts))
    assert updated == [0, 1]
    data = np.concatenate([r.obs[:-1][r.valid].reshape(-1, spec.obs_size) for r in rollouts[1]]).astype(np.float64)
    np.testing.assert_allclose(trainer.member_params(1)["obs_norm.mean"], data.mean(0), rtol=1e-5)


def test_normalized_features_are_clipped() -> None:
    norm = ObsNormalizer(1, 2, clip=2.0, device=CPU)
    norm.update(torch.tensor([[[0.0, 0.0], [2.0, 4.0]]]), torch.tensor([[True, True]]))  # mean 1, 2; std 1, 2
    out = norm(torch.tensor([[[1.0, 2.0], [100.0, -100.0]]]))
    torch.testing.assert_close(out, torch.tensor([[[0.0, 0.0], [2.0, -2.0]]]))


def test_reward_scale_follows_each_actor_slots_discounted_return_across_rollouts() -> None:
    """Returns carry over from an actor's previous rollout and restart after an episode's end; the
    rewards are divided by the std of all returns so far (VecNormalize's norm_reward)."""
    gamma, steps = 0.9, 4
    scaler = RewardScaler(1, clip=100.0, device=CPU)

    def rollout(actor: str, rewards: list[list[float]], sequence: int, done_at: int | None = None) -> Rollout:
        r = np.array(rewards, np.float32)
        terminated = np.zeros(r.shape, bool)
        if done_at is not None:
            terminated[done_at] = True
        return Rollout(
            member=0,
            policy_version=0,
            actor=actor,
            obs=np.zeros((steps + 1, r.shape[1], 1), np.float32),
            actions=np.zeros(r.shape, np.int64),
            logprobs=np.zeros(r.shape, np.float32),
            rewards=r,
            terminated=terminated,
            truncated=np.zeros(r.shape, bool),
            valid=np.ones(r.shape, bool),
            sequence=sequence,
        )

    first = rollout("a", [[1.0], [2.0], [3.0], [4.0]], sequence=1, done_at=1)
    second = rollout("a", [[1.0], [1.0], [1.0], [1.0]], sequence=2)
    after_a_gap = rollout("a", [[2.0], [0.0], [0.0], [0.0]], sequence=5)  # 3 and 4 went to another rank
    running, returns = 0.0, []  # the reference: the one slot walked step by step, across the rollouts
    for r in (first, second, after_a_gap):
        if r is after_a_gap:
            running = 0.0  # its predecessor is not here: the return starts afresh
        for t in range(steps):
            running = running * gamma + float(r.rewards[t, 0])
            returns.append(running)
            running = 0.0 if r.terminated[t, 0] else running
        rewards = torch.from_numpy(r.rewards)[None]
        running_returns = scaler.running_returns([[r]], rewards.shape, [gamma])
        scaled = scaler.scale(running_returns, torch.from_numpy(r.valid)[None], rewards)
        np.testing.assert_allclose(
            scaled[0, :, 0].numpy(), r.rewards[:, 0] / np.sqrt(np.var(returns) + 1e-8), rtol=1e-5
        )
    assert returns[:4] == pytest.approx([1.0, 2.9, 3.0, 6.7]) and returns[4] == pytest.approx(6.7 * 0.9 + 1)
    assert returns[8] == 2.0


def test_stacked_observations_pad_members_without_data() -> None:
    rollouts = norm_rank.per_member(1, 0)  # rank 1: member 1 has no rollouts
    x, mask = stacked_observations(rollouts, norm_rank.SPEC, CPU)
    assert x.shape[:2] == mask.shape and not mask[1].any()
    assert int(mask[0].sum()) == sum(int(r.valid.sum()) for r in rollouts[0])
