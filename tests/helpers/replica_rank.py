"""One rank of a real gloo world for tests/test_replicas.py: a PPOTrainer with ppo.sync = "batch"
trains a population on this rank's rollouts (observations of a scale of their own per rank, random
rewards and episode ends), counting the collectives each update makes. Before the last update rank
1's weights are nudged, which the replicas' fingerprints must catch. Run as a script:
replica_rank.py RANK WORLD PORT OUT."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from exits import leave

from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners import distributed, replicas
from rlmq.learners.trainers import make_trainer

SPEC = EnvSpec(obs_shape=(3,), action_kind="discrete", action_dim=2)
POPULATION, STEPS, SLOTS, UPDATES = 2, 8, 4, 3
DECISION = wire.Decision(id=1, target=1, source=0, hyperparams=dict.fromkeys(ALGORITHMS["ppo"].tunable, 0.5))
# minibatch_growth "size": the reference process, handed both ranks' rollouts as a batch twice as
# wide, cuts it into as many minibatches as each replica does the gathered batch.
RUN_CFG = RunConfig(
    num_envs=SLOTS,
    rollout_length=STEPS,
    population=POPULATION,
    hidden_sizes=(16,),
    normalize_obs=True,
    ppo=PPOConfig(sync="batch", epochs=2, minibatches=2, normalize_reward=True, minibatch_growth="size"),
)


def rollout(rank: int, update: int, member: int) -> Rollout:
    rng = np.random.default_rng([rank, update, member])
    done = rng.random((STEPS, SLOTS)) < 0.15
    return Rollout(
        member=member,
        policy_version=0,
        actor=f"actor-{rank}",
        sequence=update + 1,
        obs=(rng.standard_normal((STEPS + 1, SLOTS, 3)) * (1 + 3 * rank) + member).astype(np.float32),
        actions=rng.integers(0, 2, (STEPS, SLOTS)),
        logprobs=np.full((STEPS, SLOTS), np.log(0.5), np.float32),
        rewards=rng.standard_normal((STEPS, SLOTS)).astype(np.float32),
        terminated=done,
        truncated=np.zeros((STEPS, SLOTS), bool),
        valid=np.ones((STEPS, SLOTS), bool),
    )


def per_member(rank: int, update: int) -> list[list[Rollout]]:
    """One rollout of each member on each rank: gathered, the world's batch is laid out as one
    process's batch of both ranks' rollouts in rank order (tests/test_replicas.py's reference)."""
    return [[rollout(rank, update, m)] for m in range(POPULATION)]


def counting(calls: list[str]) -> None:
    """Every torch.distributed collective the trainer calls, by name, appended to `calls`."""
    for name in ("all_reduce", "all_gather", "broadcast", "all_gather_into_tensor", "reduce_scatter"):
        original: Callable[..., Any] = getattr(dist, name)

        def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(dist, name, counted)


def main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)  # different initial weights: the replicas must start from rank 0's
    device = distributed.init_world(rank, world, "127.0.0.1", port, "cpu")
    trainer = make_trainer(SPEC, RUN_CFG, (), rank, world, device)
    trainer.set_hyperparams([RUN_CFG.base_hyperparams()] * POPULATION)
    costs = replicas.measure(trainer.core, SPEC, RUN_CFG, device)  # what "auto" decides by
    calls: list[str] = []
    counting(calls)
    collectives = []
    for update in range(UPDATES + 1):
        if update == UPDATES:
            saved = {"flat": trainer.core.flat.detach().clone(), "obs_mean": trainer.obs_norm.mean.clone()}
            if rank == 1:
                with torch.no_grad():
                    trainer.core.flat[0, 0] += 1e-3
        rollouts = per_member(rank, update)
        samples = distributed.agree(True, False, False, [STEPS * SLOTS] * POPULATION, 0, False, device, 1)
        calls.clear()
        trainer.train(rollouts, samples.member_samples, 1)
        collectives.append(list(calls))
    # Without the reward scale the agreement rides in the gather (the learner's way, `agrees_in_gather`):
    # first rank 1 is not ready, so the world does not update and the batches gathered go unused;
    # then both are, a PBT copy lands on member 1, and the update trains on what was gathered.
    fused = make_trainer(
        SPEC,
        dataclasses.replace(RUN_CFG, ppo=dataclasses.replace(RUN_CFG.ppo, normalize_reward=False)),
        (),
        rank,
        world,
        device,
    )
    fused.set_hyperparams([RUN_CFG.base_hyperparams()] * POPULATION)

    def agree(ready: bool) -> tuple[list[str], distributed.Agreement]:
        calls.clear()
        agreed = fused.agree(
            distributed.proposal(ready, False, False, [STEPS * SLOTS] * POPULATION, 0, False, 1, device),
            lambda: per_member(rank, UPDATES + 1),
        )
        return list(calls), agreed

    idle_calls, idle = agree(rank == 0)
    both_calls, both = agree(True)
    staging = {
        "agrees_in_gather": fused.agrees_in_gather,
        "idle_collectives": idle_calls,
        "idle_update": idle.update,
        "collectives": both_calls,
        "update": both.update,
        "samples": both.member_samples,
        "width": fused.staged.valid.shape[2] if fused.staged is not None else 0,
    }
    fused.copy_member(DECISION)
    staging["copied_invalid"] = not bool(fused.staged.valid[DECISION.target].any())
    calls.clear()
    _, updated = fused.train(per_member(rank, UPDATES + 1), [2 * STEPS * SLOTS, 0], 1)
    staging |= {"train_collectives": list(calls), "updated": updated, "staged_after": fused.staged is not None}
    torch.save(
        {
            **saved,
            "staging": staging,
            "collectives": collectives,
            "resyncs": trainer.resyncs,
            "replicated": trainer.replicated,
            "costs": list(costs),
            "final": trainer.core.flat.detach().clone(),
            "exp_avg_sq": trainer.optimizer.exp_avg_sq.clone(),
        },
        out,
    )
    distributed.shutdown(together=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    leave()
