"""Replicated PPO updates (learners/replicas.py) in a real 2-process gloo world: one collective per
update, the update a single process makes on both ranks' data, and replicas that drift are caught
and made equal again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import replica_rank
import torch

from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.common.transport import free_port
from rlmq.learners import replicas
from rlmq.learners.trainers import make_trainer

HELPER = Path(replica_rank.__file__)


def test_two_replicas_train_as_one_process_on_both_ranks_data_with_one_collective_an_update(tmp_path: Path) -> None:
    port, world = free_port(), 2
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), str(r), str(world), str(port), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    for r, p in enumerate(procs):
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{output}"
    a, b = (torch.load(o, weights_only=True) for o in outs)
    assert a["replicated"] and b["replicated"]
    # "auto"'s measurements, the slowest rank's of each: the same on both ranks, so they decide alike.
    assert a["costs"] == b["costs"] and all(0 < cost < 1 for cost in a["costs"])
    # Each update: one all-gather (the batches and the fingerprints), nothing else.
    assert a["collectives"][: replica_rank.UPDATES] == [["all_gather"]] * replica_rank.UPDATES
    assert torch.equal(a["flat"], b["flat"]) and torch.equal(a["obs_mean"], b["obs_mean"])

    # The reference: one process, both ranks' rollouts of each member side by side in rank order,
    # from rank 0's initial weights.
    torch.manual_seed(1234)
    alone = make_trainer(replica_rank.SPEC, replica_rank.RUN_CFG, (), 0, 1, torch.device("cpu"))
    alone.set_hyperparams([replica_rank.RUN_CFG.base_hyperparams()] * replica_rank.POPULATION)
    for update in range(replica_rank.UPDATES):
        both = [
            replica_rank.per_member(0, update)[m] + replica_rank.per_member(1, update)[m]
            for m in range(replica_rank.POPULATION)
        ]
        alone.train(both, [sum(r.num_steps for r in rs) for rs in both], 2)
    moved = (a["flat"] - alone.core.flat.detach()).abs().max()
    assert float((alone.core.flat.detach() - a["final"]).abs().max()) > 0  # it trained
    torch.testing.assert_close(
        a["flat"],
        alone.core.flat.detach(),
        rtol=1e-5,
        atol=1e-6,
        msg=f"replicas differ from one process by up to {float(moved)}",
    )
    torch.testing.assert_close(a["obs_mean"], alone.obs_norm.mean, rtol=1e-9, atol=1e-9)

    # The learner's iterations without the reward scale: the agreement rides in the gather of the
    # batches each rank would take, one collective, whether or not the world then updates; a PBT
    # copy leaves its target's gathered rows out, and the update needs no collective of its own.
    staging = a["staging"]
    assert staging["agrees_in_gather"]
    assert staging["idle_collectives"] == staging["collectives"] == ["all_gather"]
    assert not staging["idle_update"] and staging["update"]
    assert staging["samples"] == [2 * replica_rank.STEPS * replica_rank.SLOTS] * replica_rank.POPULATION
    assert staging["width"] == 2 * replica_rank.SLOTS and staging["copied_invalid"]
    assert staging["train_collectives"] == [] and staging["updated"] == [0] and not staging["staged_after"]
    # Rank 1's weights nudged before the last update: the fingerprints differ, every rank takes
    # rank 0's state (one broadcast per state tensor and the generator) and they end equal.
    assert a["resyncs"] == b["resyncs"] == 1
    assert a["collectives"][-1][0] == "all_gather" and set(a["collectives"][-1][1:]) == {"broadcast"}
    assert torch.equal(a["final"], b["final"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_auto_replicates_where_the_gather_and_whole_minibatch_steps_cost_less_than_ddps_steps() -> None:
    def costs(ddp_step_s: float, replica_step_s: float, gather_s: float) -> Callable[[], replicas.SyncCosts]:
        return lambda: replicas.SyncCosts(ddp_step_s, replica_step_s, gather_s)

    # 10 gradient steps: replicas pay the gather once, and each step on the whole minibatch.
    assert replicas.choose("auto", 2, 10, costs(ddp_step_s=0.022, replica_step_s=0.0015, gather_s=0.011)) == "batch"
    assert replicas.choose("auto", 2, 10, costs(ddp_step_s=0.002, replica_step_s=0.0015, gather_s=0.006)) == "gradients"
    assert replicas.choose("auto", 2, 10, costs(ddp_step_s=0.002, replica_step_s=0.0015, gather_s=0.004)) == "batch"
    assert replicas.choose("auto", 4, 1, costs(ddp_step_s=0.005, replica_step_s=0.004, gather_s=0.002)) == "gradients"
    assert replicas.choose("gradients", 2, 10, costs(1.0, 0.0, 0.0)) == "gradients"
    assert replicas.choose("batch", 1, 10, costs(1.0, 0.0, 0.0)) == "gradients"  # one rank: nothing to sync
    assert PPOConfig().sync == "auto"


def test_auto_times_the_gather_of_the_batch_as_the_update_holds_it_at_its_widest() -> None:
    run_config = RunConfig(num_envs=8, rollout_length=32, population=2)
    per_step = 8 + 4 + 4 + 1 + 1 + 1  # action (int64), behaviour log-probability, reward, three flags
    one_rollout = 33 * 8 * 3 * 4 + 32 * 8 * per_step  # float32 features with the bootstrap row, then the steps
    assert replicas.gathered_bytes(replica_rank.SPEC, run_config) == 2 * one_rollout
    # Byte images travel as float32 features: four bytes a pixel, not one.
    pixels = EnvSpec(obs_shape=(84, 84, 4), obs_dtype="uint8", action_kind="discrete", action_dim=6)
    assert replicas.gathered_bytes(pixels, run_config) == 2 * (33 * 8 * 84 * 84 * 4 * 4 + 32 * 8 * per_step)
    # Learner batching's widest batch, and the reward scale's float64 running returns.
    wide = RunConfig(
        num_envs=8, rollout_length=32, population=1, ppo=PPOConfig(max_rollouts_per_batch=4, normalize_reward=True)
    )
    assert replicas.gathered_bytes(replica_rank.SPEC, wide) == 4 * (one_rollout + 32 * 8 * 8)
