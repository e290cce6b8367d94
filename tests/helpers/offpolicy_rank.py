"""One rank of a real gloo world for the DDP tests of tests/test_td3.py and tests/test_dqn.py: an
off-policy trainer (`make_trainer`, as the learner builds it) trains a population on rank-specific
data, applies a PBT copy, then saves every replicated tensor and optimizer state for the test to
compare across ranks. Run as a script (not imported):

    offpolicy_rank.py ALGO RANK WORLD PORT UPDATES OUT [MAX_STEPS_PER_UPDATE]

With MAX_STEPS_PER_UPDATE, each update is taken in chunks, the owed ones on no new data, as the
learner takes them (learners/learner.py): every rank must owe alike, or the world hangs.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from exits import leave

from rlmq.common import wire
from rlmq.common.algorithms import DQNConfig, TD3Config
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners import distributed
from rlmq.learners.offpolicy import OffPolicyTrainer
from rlmq.learners.trainers import make_trainer

SPECS = {
    "td3": EnvSpec(
        obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
    ),
    "dqn": EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3),
}
POPULATION, STEPS, SLOTS = 3, 8, 4


def rollout(rng: np.random.Generator, spec: EnvSpec, member: int) -> Rollout:
    done = rng.random((STEPS, SLOTS)) < 0.1
    valid = np.ones((STEPS, SLOTS), bool)
    valid[1:] = ~done[:-1]
    if spec.action_kind == "discrete":
        actions = rng.integers(0, spec.action_dim, (STEPS, SLOTS)).astype(np.int64)
    else:
        actions = rng.uniform(spec.action_low, spec.action_high, (STEPS, SLOTS, spec.action_dim)).astype(np.float32)
    return Rollout(
        member=member,
        policy_version=0,
        actor="t",
        obs=rng.standard_normal((STEPS + 1, SLOTS, spec.obs_size)).astype(np.float32),
        actions=actions,
        logprobs=np.zeros((STEPS, SLOTS), np.float32),
        rewards=rng.random((STEPS, SLOTS)).astype(np.float32),
        terminated=done & (rng.random((STEPS, SLOTS)) < 0.5),
        truncated=np.zeros((STEPS, SLOTS), bool),
        valid=valid,
    )


CHUNKS = [0]  # updates taken, chunks that paid owed steps included


def train(trainer: OffPolicyTrainer, per_member: list[list[Rollout]]) -> int:
    local = [sum(r.num_steps for r in rs) for rs in per_member]
    agreed = distributed.agree(True, False, False, local, 0, False, torch.device("cpu"), 1)
    assert agreed.update and not agreed.stop
    _, updated = trainer.train(per_member, agreed.member_samples, 1)
    CHUNKS[0] += 1
    while trainer.owes_steps():
        owed = distributed.agree(True, False, False, [0] * POPULATION, 0, False, torch.device("cpu"), 1)
        trainer.train([[] for _ in range(POPULATION)], owed.member_samples, 0)
        CHUNKS[0] += 1
    return len(updated)


def main(algo: str, rank: int, world: int, port: int, updates: int, out: str, max_steps_per_update: int = 0) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)  # different initial weights: the trainer must make them equal
    spec = SPECS[algo]
    shared = {
        "hidden_sizes": (16, 16),
        "batch_size": 8,
        "learning_starts": 1,
        "replay_ratio": 0.25,
        "max_steps_per_update": max_steps_per_update,
    }
    run_config = RunConfig(
        algo=algo,
        num_envs=SLOTS,
        rollout_length=STEPS,
        population=POPULATION,
        seed=7,
        td3=TD3Config(**shared, policy_delay=2),  # type: ignore[arg-type]
        dqn=DQNConfig(**shared, target_update_interval=3, max_grad_norm=0.5),  # type: ignore[arg-type]
        pbt=PBTConfig(ranges={"learning_rate": HyperRange(1e-4, 1e-2)}),
    )
    device = distributed.init_world(rank, world, "127.0.0.1", port, "cpu")
    trainer = make_trainer(spec, run_config, (), rank, world, device)
    assert isinstance(trainer, OffPolicyTrainer)
    base = run_config.base_hyperparams()
    trainer.set_hyperparams([{**base, "learning_rate": 1e-3 * (m + 1)} for m in range(POPULATION)])
    algorithm = trainer.algorithm
    optimizers = list(algorithm.optimizers.values())  # type: ignore[attr-defined]
    before = [t.detach().clone() for t in algorithm.replicated()]
    rng = np.random.default_rng(100 + rank)  # different data on each rank
    for _ in range(updates):
        # Uneven: rank 1 holds two rollouts of member 0 to rank 0's one, and none of member 1, which
        # trains from rank 0's data alone (rank 1's loss for it counts 0, but it joins every sync);
        # member 2 has no data anywhere: it never starts, and must not move at all.
        assert (
            train(
                trainer,
                [[rollout(rng, spec, 0) for _ in range(1 + rank)], [rollout(rng, spec, 1)] if rank == 0 else [], []],
            )
            == 2
        )
    after = algorithm.replicated()
    moved = min(float((a - b)[:2].abs().sum(1).min()) for a, b in zip(after, before, strict=True))
    inactive_unmoved = all(torch.equal(a[2], b[2]) for a, b in zip(after, before, strict=True))
    # A PBT copy (the agreement that hands it to every rank: tests/test_ddp.py), then more training.
    trainer.copy_member(wire.Decision(id=1, target=2, source=0, hyperparams={**base, "learning_rate": 5e-3}))
    copied = all(torch.equal(t[2], t[0]) for t in algorithm.replicated())
    train(trainer, [[rollout(rng, spec, 0)], [rollout(rng, spec, 1)], [rollout(rng, spec, 2)] if rank == 1 else []])
    torch.save(
        {
            "replicated": [t.detach().clone() for t in algorithm.replicated()],
            "optimizers": [t.clone() for o in optimizers for t in (o.exp_avg, o.exp_avg_sq, o.steps)],
            "moved": moved,
            "inactive_unmoved": inactive_unmoved,
            "copied": copied,
            "chunks": CHUNKS[0],
        },
        out,
    )
    distributed.shutdown(together=True)


if __name__ == "__main__":
    chunk = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], chunk)
    leave()
