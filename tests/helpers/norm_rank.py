"""One rank of a real gloo world whose observation statistics merge every rank's data: each rank
feeds `ObsNormalizer` the rollouts of its own actors (seeded by rank and actor), then saves the
statistics. Run as a script: norm_rank.py RANK WORLD PORT OUT."""

from __future__ import annotations

import sys

import numpy as np
import torch
from exits import leave

from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners import distributed
from rlmq.learners.normalization import ObsNormalizer, stacked_observations

SPEC = EnvSpec(obs_shape=(2, 3), action_kind="discrete", action_dim=2)
POPULATION, STEPS, SLOTS, ACTORS, UPDATES = 2, 5, 3, 2, 3


def actor_rollout(rank: int, actor: int, update: int, member: int) -> Rollout:
    """A rollout with observations of a scale and offset of its own, and some reset steps."""
    rng = np.random.default_rng([rank, actor, update, member])
    obs = rng.standard_normal((STEPS + 1, SLOTS, *SPEC.obs_shape)) * (1 + 3 * rank + actor) + 10 * member + actor
    return Rollout(
        member=member,
        policy_version=0,
        actor=f"{rank}-{actor}",
        obs=obs.astype(np.float32),
        actions=np.zeros((STEPS, SLOTS), np.int64),
        logprobs=np.zeros((STEPS, SLOTS), np.float32),
        rewards=np.zeros((STEPS, SLOTS), np.float32),
        terminated=np.zeros((STEPS, SLOTS), bool),
        truncated=np.zeros((STEPS, SLOTS), bool),
        valid=rng.random((STEPS, SLOTS)) > 0.2,
    )


def per_member(rank: int, update: int) -> list[list[Rollout]]:
    # Member 1 gets data from rank 0 only: rank 1 still joins every all-reduce, with nothing.
    return [
        [actor_rollout(rank, a, update, m) for a in range(ACTORS)] if m == 0 or rank == 0 else []
        for m in range(POPULATION)
    ]


def main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    device = distributed.init_world(rank, world, "127.0.0.1", port, "cpu")
    norm = ObsNormalizer(POPULATION, SPEC.obs_size, clip=10.0, device=device)
    for update in range(UPDATES):
        norm.update(*stacked_observations(per_member(rank, update), SPEC, device))
    torch.save({"mean": norm.mean, "var": norm.var, "count": norm.count}, out)
    distributed.shutdown(together=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    leave()
