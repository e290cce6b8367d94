"""One rank of a real gloo world for tests/test_sac.py: SAC, or TD3 with a critic shared by the
members ("td3-shared"), steps on rank-specific data, every optimizer synced by `allreduce_mean`;
saves every network and optimizer state. Run as a script: RANK WORLD PORT OUT [ALGO]."""

from __future__ import annotations

import sys

import torch
from exits import leave

from rlmq.common.algorithms import SACConfig, TD3Config
from rlmq.common.schema import EnvSpec
from rlmq.learners import distributed
from rlmq.learners.offpolicy import allreduce_mean
from rlmq.learners.replay import Transitions
from rlmq.learners.sac import SAC
from rlmq.learners.td3 import TD3

SPEC = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=1, action_low=(-2.0,), action_high=(2.0,))


def main(rank: int, world: int, port: int, out: str, algo_name: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(100 + rank)  # different initial weights: the broadcast must make them equal
    device = distributed.init_world(rank, world, "127.0.0.1", port, "cpu")
    algo: SAC | TD3 = (
        SAC(SPEC, SACConfig(hidden_sizes=(16, 16)), population=2, device=device)
        if algo_name == "sac"
        else TD3(
            SPEC, TD3Config(hidden_sizes=(16, 16), shared_critic=True, policy_delay=1), population=2, device=device
        )
    )
    for tensor in algo.replicated():
        torch.distributed.broadcast(tensor.data, src=0)
    start = algo.actor.flat.detach().clone()
    hp = algo.hyperparams(
        [{"learning_rate": 3e-3, "gamma": 0.99, "tau": 0.01}, {"learning_rate": 1e-3, "gamma": 0.9, "tau": 0.05}],
        device,
    )
    g = torch.Generator().manual_seed(rank)  # different data and policy noise on each rank
    everyone = torch.tensor([True, True])
    has_data = torch.tensor([True, rank == 0])  # member 1's data are all on rank 0
    for _ in range(6):
        batch = Transitions(
            torch.randn(2, 32, 3, generator=g),
            torch.rand(2, 32, 1, generator=g) * 4 - 2,
            torch.randn(2, 32, generator=g),
            torch.randn(2, 32, 3, generator=g),
            torch.zeros(2, 32),
            torch.ones(2, 32),
        )
        algo.step(batch, hp, everyone, has_data, allreduce_mean, g)
    state = {f"net{i}": t.detach() for i, t in enumerate(algo.replicated())}
    for name, optimizer in algo.optimizers.items():
        state[f"{name}_exp_avg"], state[f"{name}_exp_avg_sq"] = optimizer.exp_avg, optimizer.exp_avg_sq
    torch.save({**state, "moved": float((algo.actor.flat.detach() - start).abs().sum())}, out)
    distributed.shutdown(together=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "sac")
    leave()
