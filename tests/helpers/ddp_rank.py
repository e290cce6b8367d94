"""One rank of a real gloo world for tests/test_ddp.py: trains on rank-specific data, then saves
its parameters and optimizer state for the test to compare. Run as a script (not imported)."""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from rlmq.common.config import EnvSpec, PPOConfig
from rlmq.common.wire import Rollout
from rlmq.learners import distributed, ppo
from rlmq.learners.networks import ActorCritic


def rollout(rng: np.random.Generator, steps: int = 16, slots: int = 8) -> Rollout:
    done = rng.random((steps, slots)) < 0.1
    valid = np.ones((steps, slots), bool)
    valid[1:] = ~done[:-1]
    return Rollout(
        member=0, policy_version=0, actor="t",
        obs=rng.standard_normal((steps + 1, slots, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (steps, slots)).astype(np.int64),
        logprobs=np.full((steps, slots), np.log(0.5), np.float32),
        rewards=rng.random((steps, slots)).astype(np.float32),
        terminated=done & (rng.random((steps, slots)) < 0.5), truncated=np.zeros((steps, slots), bool),
        valid=valid,
    )  # fmt: skip


def main(rank: int, world: int, port: int, updates: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(1234 + rank)  # different initial weights: DDP must make them equal
    spec = EnvSpec(obs_dim=4, action_kind="discrete", action_dim=2)
    core = ActorCritic(spec, (32, 32))
    device = torch.device("cpu")
    distributed.init_world(rank, world, "127.0.0.1", port, device)
    model = DistributedDataParallel(core)
    optimizer = torch.optim.Adam(core.parameters(), lr=3e-3, fused=True)  # as the learner's
    cfg = PPOConfig(epochs=2, minibatches=3, max_grad_norm=0.1)
    rng = np.random.default_rng(100 + rank)  # different data on each rank
    generator = torch.Generator().manual_seed(rank)
    before = [p.detach().clone() for p in core.parameters()]
    for _ in range(updates):
        # Uneven batches: rank 1 holds more rollouts, so its minibatches differ in size.
        batch = ppo.join_rollouts([rollout(rng) for _ in range(1 + rank)], device)
        agreed = distributed.agree(True, False, 1, device)
        assert agreed.everyone_has_batch and not agreed.stop
        ppo.update(model, core, optimizer, batch, cfg, generator)
    # Rank 1 keeps 2 valid samples for 3 minibatches: one of its minibatches is empty, and it
    # must still run that backward pass (with a zero loss), or rank 0 waits in DDP forever.
    sparse = rollout(rng)
    if rank == 1:
        sparse.valid[:] = False
        sparse.valid[0, :2] = True
    ppo.update(model, core, optimizer, ppo.join_rollouts([sparse], device), cfg, generator)
    # One rank without a batch: nobody updates; one rank stopping: everybody stops.
    assert not distributed.agree(rank == 0, False, 5, device).everyone_has_batch
    assert distributed.agree(True, rank == 1, 5, device).stop
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(core.parameters(), before, strict=True))
    torch.save({"params": core.state_dict(), "optim": optimizer.state_dict()["state"], "moved": moved}, out)
    distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
