"""Learner batching (IMPALA's): an update takes every rollout a member has queued, up to
`ppo.max_rollouts_per_batch`, and its minibatch plan follows the batch. The world's agreement on
the width, over real gloo ranks, is in tests/helpers/ddp_rank.py (test_ddp.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlmq.common import wire
from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.loading import load_run_config
from rlmq.common.schema import EnvSpec
from rlmq.learners import minibatching
from rlmq.learners.credits import CreditTimeouts
from rlmq.learners.members import MemberQueues
from rlmq.learners.trainers import make_trainer

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
STEPS, SLOTS = 8, 3


def rollout(rng: np.random.Generator, member: int, valid_steps: int = STEPS) -> wire.Rollout:
    valid = np.zeros((STEPS, SLOTS), bool)
    valid[:valid_steps] = True
    return wire.Rollout(
        member=member,
        policy_version=0,
        actor="a",
        obs=rng.standard_normal((STEPS + 1, SLOTS, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (STEPS, SLOTS)),
        logprobs=np.full((STEPS, SLOTS), -0.69, np.float32),
        rewards=rng.random((STEPS, SLOTS)).astype(np.float32),
        terminated=np.zeros((STEPS, SLOTS), bool),
        truncated=np.zeros((STEPS, SLOTS), bool),
        valid=valid,
    )


def queues(need: int, most: int) -> MemberQueues:
    return MemberQueues(2, 16, CreditTimeouts(), need, 2**62, 0.05, 0.25, most_per_batch=most)


@pytest.mark.parametrize(
    "most,queued,size",
    [
        (4, 1, 0),  # fewer than a batch: none yet
        (4, 3, 3),  # all that came, up to the most
        (4, 6, 4),
        (0, 6, 2),  # batching off: exactly rollouts_per_batch
    ],
)
def test_a_batch_takes_every_rollout_queued_up_to_the_most(most: int, queued: int, size: int) -> None:
    rng = np.random.default_rng(0)
    members = queues(2, most)
    for i in range(queued):
        members.enqueue(rollout(rng, 0, valid_steps=1 + i))  # each rollout its own sample count
    members.enqueue(rollout(rng, 1))  # member 1: one rollout, short of a batch
    assert members.batch_sizes() == [size, 0]
    assert members.batch_samples() == [SLOTS * sum(range(1, size + 1)), 0]
    taken = members.take()
    assert [len(r) for r in taken.rollouts] == [size, 0]
    assert [int(r.valid.sum()) for r in taken.rollouts[0]] == [SLOTS * (1 + i) for i in range(size)]  # oldest first
    assert members.queued == queued - size + 1


def assert_each_epoch_covers_every_sample_once(plan: list[torch.Tensor | None], minibatches: int, samples: int) -> None:
    for epoch in range(len(plan) // minibatches):
        chunks = plan[epoch * minibatches : (epoch + 1) * minibatches]
        assert all(idx is not None for idx in chunks)
        covered = torch.cat([idx for idx in chunks if idx is not None]).sort().values
        assert torch.equal(covered, torch.arange(samples))


@pytest.mark.parametrize("rollouts,minibatches", [(2, 3), (3, 4), (4, 6), (8, 12)])
def test_the_minibatches_keep_their_size_and_grow_in_number(rollouts: int, minibatches: int) -> None:
    cfg = PPOConfig(rollouts_per_batch=2, minibatches=3, max_rollouts_per_batch=8)
    grown = minibatching.for_batch(cfg, rollouts)
    assert grown.minibatches == minibatches and grown.epochs == cfg.epochs
    plan = minibatching.minibatch_plan(rollouts * SLOTS * STEPS, grown, torch.Generator().manual_seed(0))
    assert len(plan) == cfg.epochs * minibatches
    sizes = {len(idx) for idx in plan if idx is not None}
    assert max(sizes) - min(sizes) <= 1 and abs(min(sizes) - 2 * SLOTS * STEPS / 3) <= 2  # as with 2 rollouts
    assert_each_epoch_covers_every_sample_once(plan, minibatches, rollouts * SLOTS * STEPS)


@pytest.mark.parametrize("rollouts", [2, 3, 8])
def test_minibatches_grown_in_size_keep_their_number(rollouts: int) -> None:
    cfg = PPOConfig(rollouts_per_batch=2, minibatches=3, max_rollouts_per_batch=8, minibatch_growth="size")
    grown = minibatching.for_batch(cfg, rollouts)
    assert grown.minibatches == 3 and grown.epochs == cfg.epochs
    plan = minibatching.minibatch_plan(rollouts * SLOTS * STEPS, grown, torch.Generator().manual_seed(0))
    assert len(plan) == cfg.epochs * 3
    sizes = {len(idx) for idx in plan if idx is not None}
    assert max(sizes) - min(sizes) <= 1 and abs(min(sizes) - rollouts * SLOTS * STEPS / 3) <= 2
    assert_each_epoch_covers_every_sample_once(plan, 3, rollouts * SLOTS * STEPS)


@pytest.mark.parametrize("rollouts,minibatches", [(2, 3), (4, 4), (8, 6)])  # 3·√1, 3·√2 = 4.2, 3·√4
def test_minibatches_grown_by_the_square_root_grow_in_number_and_size_alike(rollouts: int, minibatches: int) -> None:
    cfg = PPOConfig(rollouts_per_batch=2, minibatches=3, max_rollouts_per_batch=8, minibatch_growth="sqrt")
    grown = minibatching.for_batch(cfg, rollouts)
    assert grown.minibatches == minibatches and grown.epochs == cfg.epochs
    plan = minibatching.minibatch_plan(rollouts * SLOTS * STEPS, grown, torch.Generator().manual_seed(0))
    assert len(plan) == cfg.epochs * minibatches
    sizes = {len(idx) for idx in plan if idx is not None}
    assert max(sizes) - min(sizes) <= 1 and abs(min(sizes) - rollouts * SLOTS * STEPS / minibatches) <= 2
    assert_each_epoch_covers_every_sample_once(plan, minibatches, rollouts * SLOTS * STEPS)


def test_the_fleet_candidate_config_loads_and_cuts_14_rollouts_into_4_minibatches() -> None:
    """benchmarks/ppo-cartpole-fleet.toml, which benchmarks/gpu_checks.sh runs: √14 ≈ 3.7."""
    run_config = load_run_config(Path(__file__).parents[1] / "benchmarks" / "ppo-cartpole-fleet.toml", {})
    assert run_config.env_id == "CartPole-v1" and run_config.ppo.minibatch_growth == "sqrt"
    assert minibatching.for_batch(run_config.ppo, 1) == run_config.ppo
    assert minibatching.for_batch(run_config.ppo, 14).minibatches == 4


def test_a_minibatch_growth_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match='minibatch_growth is "count", "size" or "sqrt"'):
        PPOConfig(minibatch_growth="both")


def test_a_grown_batch_trains_on_every_rollout_in_more_minibatch_steps() -> None:
    """The PPO trainer given 3 rollouts of one member and 1 of the other, batches 3 rollouts wide:
    each member's trained steps count every sample, and each took epochs × 3 optimizer steps (one
    rollout a minibatch) where a batch of one takes epochs × 1."""
    run_config = RunConfig(
        num_envs=SLOTS,
        rollout_length=STEPS,
        population=2,
        rollouts_in_flight=4,
        ppo=PPOConfig(epochs=2, minibatches=1, max_rollouts_per_batch=4),
    )
    trainer = make_trainer(SPEC, run_config, (), 0, 1, torch.device("cpu"))
    trainer.set_hyperparams([run_config.base_hyperparams()] * 2)
    rng = np.random.default_rng(1)
    per_member = [[rollout(rng, 0) for _ in range(3)], [rollout(rng, 1)]]
    samples = [sum(int(r.valid.sum()) for r in member) for member in per_member]
    before = trainer.core.flat.detach().clone()
    _, updated = trainer.train(per_member, samples, 3)
    assert updated == [0, 1] and [trainer.trained_steps(m) for m in range(2)] == samples == [72, 24]
    assert trainer.optimizer.steps.tolist() == [2 * 3, 2 * 3]  # every member steps in every minibatch
    assert not torch.equal(trainer.core.flat.detach(), before)
