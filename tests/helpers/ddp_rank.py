"""One rank of a real gloo world for tests/test_ddp.py: trains a population on rank-specific data,
applies a PBT decision that only rank 0 received, then saves its parameters and optimizer state for
the test to compare. Run as a script (not imported)."""

from __future__ import annotations

import functools
import sys

import numpy as np
import torch
from exits import leave
from torch.nn.parallel import DistributedDataParallel

from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.recurrent import STATE_PARTS
from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners import distributed, minibatching, ppo, stacked_mlp
from rlmq.learners.networks import PopulationActorCritic
from rlmq.learners.offpolicy import allreduce_mean
from rlmq.learners.onpolicy import copy_member
from rlmq.learners.optim import PopulationAdam, per_member

TUNABLE = ALGORITHMS["ppo"].tunable

# Flat observations, or [H, W, C] byte images through MinAtar's convolutional encoder and an LSTM
# core, whose minibatches are whole slots (argv[6]): the spec, encoder and core of each.
FLAT = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
NETWORKS = {
    "mlp": (FLAT, "mlp", "identity"),
    "minatar-lstm": (
        EnvSpec(obs_shape=(5, 5, 2), obs_dtype="uint8", action_kind="discrete", action_dim=2),
        "minatar",
        "lstm",
    ),
}
SPEC, CORE, CORE_SIZE = FLAT, "identity", 8
STATE_SIZE = 0
POPULATION, STEPS, SLOTS = 3, 16, 8
DECISION = wire.Decision(id=1, target=2, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.5))


def rollout(rng: np.random.Generator, member: int) -> Rollout:
    done = rng.random((STEPS, SLOTS)) < 0.1
    valid = np.ones((STEPS, SLOTS), bool)
    valid[1:] = ~done[:-1]
    return Rollout(
        member=member,
        policy_version=0,
        actor="t",
        obs=(
            rng.standard_normal((STEPS + 1, SLOTS, *SPEC.obs_shape)).astype(np.float32)
            if SPEC.obs_dtype == "float32"
            else rng.integers(0, 256, (STEPS + 1, SLOTS, *SPEC.obs_shape), dtype=np.uint8)
        ),
        actions=rng.integers(0, 2, (STEPS, SLOTS)).astype(np.int64),
        logprobs=np.full((STEPS, SLOTS), np.log(0.5), np.float32),
        rewards=rng.random((STEPS, SLOTS)).astype(np.float32),
        terminated=done & (rng.random((STEPS, SLOTS)) < 0.5),
        truncated=np.zeros((STEPS, SLOTS), bool),
        valid=valid,
        core_state=rng.standard_normal((SLOTS, STATE_SIZE)).astype(np.float32) if STATE_SIZE else None,
    )


def train_once(
    model: torch.nn.Module,
    core: PopulationActorCritic,
    optimizer: PopulationAdam,
    rollouts: list[list[Rollout]],
    cfg: PPOConfig,
    generator: torch.Generator,
    ready: bool = True,
    overdue: bool = False,
    captured: ppo.CapturedSteps | None = None,
) -> int:
    """One update as a learner makes it, the batch as wide as the most rollouts of a member any
    rank holds (learner batching), its minibatches as many more (`ppo.for_batch`)."""
    device = torch.device("cpu")
    local = [sum(r.num_steps for r in rs) for rs in rollouts]
    agreed = distributed.agree(ready, overdue, False, local, 0, False, device, max(len(rs) for rs in rollouts))
    assert agreed.update and not agreed.stop
    width = agreed.batch_rollouts
    cfg = minibatching.for_batch(cfg, width)
    samples = torch.tensor(agreed.member_samples)
    hp = per_member(
        ppo.MemberHyperparams,
        [
            {**dict.fromkeys(TUNABLE, 0.1), "learning_rate": 3e-3 * (m + 1), "gamma": 0.99, "gae_lambda": 0.95}
            for m in range(POPULATION)
        ],
        device,
    )
    ppo.update(
        model,
        core,
        optimizer,
        ppo.join_rollouts(rollouts, SPEC, STEPS, width * SLOTS, device, STATE_SIZE),
        hp,
        cfg,
        minibatching.minibatch_plan(width * SLOTS if STATE_SIZE else STEPS * width * SLOTS, cfg, generator),
        torch.ones(POPULATION),
        ppo.loss_normalizers(samples, cfg.minibatches, 2),
        samples > 0,
        captured,
    )
    return width


def main(rank: int, world: int, port: int, updates: int, out: str, network: str, backend: str) -> None:
    """`backend` "": eager, under DDP; else the update captured with that torch.compile backend
    (learners/capture.py), without DDP: its steps all-reduce the gradient themselves."""
    global SPEC, CORE, STATE_SIZE
    SPEC, encoder, CORE = NETWORKS[network]
    STATE_SIZE = STATE_PARTS[CORE] * CORE_SIZE
    torch.set_num_threads(1)
    # NumPy's matmuls, though these batches are small: a population's path.
    stacked_mlp.use_cpu_matmul("numpy", min_macs=0)
    torch.manual_seed(1234 + rank)  # different initial weights: DDP must make them equal
    core = PopulationActorCritic(SPEC, (32, 32), POPULATION, encoder=encoder, core=CORE, core_size=CORE_SIZE)
    device = distributed.init_world(rank, world, "127.0.0.1", port, "cpu")
    model: torch.nn.Module = core
    captured = ppo.capture("default", allreduce_mean, backend) if backend else None
    if captured is None:
        model = DistributedDataParallel(core)
    else:  # what PPOTrainer does in DDP's place
        torch.distributed.broadcast(core.flat.data, src=0)
    train = functools.partial(train_once, captured=captured)
    optimizer = PopulationAdam(core.flat)
    cfg = PPOConfig(epochs=2, minibatches=3, max_grad_norm=0.1)
    rng = np.random.default_rng(100 + rank)  # different data on each rank
    generator = torch.Generator().manual_seed(rank)
    before = core.flat.detach().clone()
    for i in range(updates):
        # Uneven: rank 1 holds two rollouts of member 0 and none of member 1, so both ranks take
        # batches two rollouts wide (6 minibatches); member 2 has data (on rank 0) in the first
        # update only, then none anywhere: inactive, it must not move at all, though its Adam
        # state has momentum.
        width = train(
            model,
            core,
            optimizer,
            [
                [rollout(rng, 0) for _ in range(1 + rank)],
                [rollout(rng, 1)] if rank == 0 else [],
                [rollout(rng, 2)] if i == 0 and rank == 0 else [],
            ],
            cfg,
            generator,
        )
        assert width == 2, width
        if i == 0:
            after_first = core.flat.detach()[2].clone()
    # Rank 1 keeps 2 valid samples of member 0 for 3 minibatches: one of its minibatches is empty,
    # and it must still run that backward pass (with a zero loss), or rank 0 waits in DDP forever.
    sparse = rollout(rng, 0)
    if rank == 1:
        sparse.valid[:] = False
        sparse.valid[0, :2] = True
    assert train(model, core, optimizer, [[sparse], [rollout(rng, 1)], []], cfg, generator) == 1
    # Rank 1 has no data at all and is not ready; rank 0 has waited too long for it (overdue):
    # both update, rank 1 on an empty batch, and the replicas stay equal.
    empty_handed = [[rollout(rng, 0)], [], []] if rank == 0 else [[], [], []]
    train(model, core, optimizer, empty_handed, cfg, generator, ready=rank == 0, overdue=rank == 0)
    inactive_unmoved = bool(torch.equal(core.flat.detach()[2], after_first)) and not torch.equal(after_first, before[2])
    # A PBT decision only rank 0 received reaches every rank through the agreement.
    encoded = wire.encode(DECISION) if rank == 0 else b""
    agreed = distributed.agree(False, False, False, [0] * POPULATION, len(encoded), False, device, 1)
    decision = wire.decode(distributed.share(encoded, agreed.decision_bytes, device))
    assert isinstance(decision, wire.Decision) and decision == DECISION
    copy_member(core, optimizer, decision)
    copied = core.flat.detach().clone()
    assert torch.equal(optimizer.exp_avg[2], optimizer.exp_avg[0])
    train(model, core, optimizer, [[rollout(rng, 0)], [rollout(rng, 1)], [rollout(rng, 2)]], cfg, generator)
    # One rank not ready: nobody updates, until the ready one is overdue; one rank stopping:
    # everybody stops.
    assert not distributed.agree(rank == 0, False, False, [5] * POPULATION, 0, False, device, 1).update
    assert distributed.agree(rank == 0, rank == 0, False, [5] * POPULATION, 0, False, device, 1).update
    assert distributed.agree(True, False, rank == 1, [5] * POPULATION, 0, False, device, 1).stop
    torch.save(
        {
            "flat": core.flat.detach(),
            "copied": copied,
            "exp_avg": optimizer.exp_avg,
            "exp_avg_sq": optimizer.exp_avg_sq,
            "steps": optimizer.steps,
            "moved": float((core.flat.detach() - before).abs().sum(1)[:2].min()),
            "inactive_unmoved": inactive_unmoved,
        },
        out,
    )
    distributed.shutdown(together=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7])
    leave()
