"""R2D2: the replay keeps whole slot sequences with their first core state, and the population's
loss over them (burn-in, double-Q, n-step) equals a reference written member by member with
torch's own cells, gradients included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rlmq.actors.collector import Collector
from rlmq.common import envs
from rlmq.common.algorithms import DQNConfig
from rlmq.common.models import NumpyPolicy
from rlmq.common.recurrent import STATE_PARTS
from rlmq.common.schema import EnvSpec
from rlmq.learners.cores import episode_starts
from rlmq.learners.dqn import QNetwork
from rlmq.learners.networks import Memory
from rlmq.learners.r2d2 import R2D2
from rlmq.learners.sequence_replay import SequenceReplay, Sequences
from tests.helpers.references import to_numpy_params

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3)
P, T, B, SIZE = 2, 7, 5, 6  # members, steps, sequences, core units
CPU = torch.device("cpu")


def random_sequences(kind: str, seed: int) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    shape = (P, T, B)
    rows = torch.arange(T).view(1, T, 1)
    return Sequences(
        obs=torch.randn(P, T + 1, B, SPEC.obs_size, generator=g),
        actions=torch.randint(0, SPEC.action_dim, shape, generator=g),
        returns=torch.randn(shape, generator=g),
        horizon=torch.minimum(torch.randint(1, 4, shape, generator=g), T - rows),  # never past row T
        terminated=(torch.rand(shape, generator=g) < 0.2).float(),
        valid=torch.rand(shape, generator=g) < 0.85,
        core_state=torch.randn(P, B, STATE_PARTS[kind] * SIZE, generator=g) * 0.5,
    )


def cell_step(cell: nn.Module, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    if isinstance(cell, nn.LSTMCell):
        h, c = cell(x, state.chunk(2, dim=1))
        return torch.cat([h, c], dim=1)
    out: torch.Tensor = cell(x, state)
    return out


def reference_loss(
    online: QNetwork, target: QNetwork, batch: Sequences, m: int, gamma: float, burn: int
) -> torch.Tensor:
    """Member m's loss as the R2D2 paper states it, one sequence and one step at a time."""
    starts = episode_starts(batch.valid[m])  # [T + 1, B]
    obs, state = batch.obs[m], batch.core_state[m]
    with torch.no_grad():
        target_q = target(obs.flatten(0, 1), Memory(state, starts)).view(T + 1, B, -1)
        for t in range(burn):
            state = cell_step(online.core, obs[t], state * (~starts[t]).unsqueeze(1))
    online_q = online(obs[burn:].flatten(0, 1), Memory(state, starts[burn:])).view(T + 1 - burn, B, -1)
    terms = []
    for t in range(burn, T):
        for b in range(B):
            if not batch.valid[m, t, b]:
                continue
            k = int(batch.horizon[m, t, b])
            row = t + k - burn
            best = int(online_q[row, b].argmax())
            bootstrap = (1 - batch.terminated[m, t, b]) * gamma**k * target_q[t + k, b, best]
            y = batch.returns[m, t, b] + bootstrap
            q = online_q[t - burn, b, batch.actions[m, t, b]]
            terms.append(nn.functional.smooth_l1_loss(q, y.detach()))
    return torch.stack(terms).mean()


@pytest.mark.parametrize("kind,burn", [("lstm", 3), ("gru", 0)])
def test_the_populations_r2d2_loss_equals_the_papers_member_by_member_with_its_gradient(kind: str, burn: int) -> None:
    torch.manual_seed(0)
    algorithm = R2D2(SPEC, DQNConfig(hidden_sizes=(8,), burn_in=burn), P, CPU, "mlp", kind, SIZE)
    with torch.no_grad():  # a target network apart from the online one
        algorithm.target.flat.add_(0.3 * torch.randn_like(algorithm.target.flat))
    batch = random_sequences(kind, seed=1)
    gamma = torch.tensor([0.9, 0.99])
    loss, _ = algorithm.loss(batch, gamma, torch.ones(P))
    loss.sum().backward()
    assert algorithm.q.flat.grad is not None
    for m in range(P):
        online, target = (QNetwork(SPEC, (8,), "mlp", kind, SIZE) for _ in range(2))
        for net, stacked in ((online, algorithm.q), (target, algorithm.target)):
            net.load_state_dict({k: torch.from_numpy(v) for k, v in stacked.member_params(m).items()})
        want = reference_loss(online, target, batch, m, float(gamma[m]), burn)
        want.backward()
        torch.testing.assert_close(loss[m], want.detach(), rtol=1e-5, atol=1e-6)
        grads = torch.cat([p.grad.reshape(-1) for p in online.parameters()])  # state-dict order
        torch.testing.assert_close(algorithm.q.flat.grad[m], grads, rtol=1e-4, atol=1e-6)


def test_the_sequence_replay_keeps_each_slots_rollout_with_its_first_state() -> None:
    """Rollouts of a recurrent ε-greedy policy, stored and drawn: each drawn sequence is one
    slot's rollout as the actor sent it (observations, actions, validity and first state), its
    n-step returns as the flat replay computes them; the ring keeps the newest."""
    env = envs.make_vector_env("CartPoleNoVel-v1", 3)
    spec = envs.describe(env, "CartPoleNoVel-v1")
    policy = NumpyPolicy(to_numpy_params(QNetwork(spec, (8,), "mlp", "lstm", SIZE)), spec, activation="relu")
    collector = Collector(env, spec, T, seed=2)
    try:
        rollouts = [collector.collect(policy, 0, 1, "a") for _ in range(3)]
    finally:
        collector.close()
    replay = SequenceReplay(1, 6, spec, T, 2 * SIZE, n=2)
    for rollout in rollouts:
        replay.add_rollout(0, rollout, gamma=0.5)
    stored = {  # what the ring holds after 9 sequences in 6 places: the last two rollouts
        (i, slot): rollout for i, rollout in enumerate(rollouts[1:]) for slot in range(3)
    }
    batch, active = replay.sample(40, np.random.default_rng(0))
    assert bool(active.all())
    for b in range(40):
        first = batch.core_state[0, b].numpy()
        (i, slot), rollout = next((key, r) for key, r in stored.items() if np.array_equal(r.core_state[key[1]], first))
        np.testing.assert_array_equal(batch.obs[0, :, b].numpy(), rollout.obs[:, slot])
        np.testing.assert_array_equal(batch.actions[0, :, b].numpy(), rollout.actions[:, slot])
        np.testing.assert_array_equal(batch.valid[0, :, b].numpy(), rollout.valid[:, slot])
        assert batch.returns[0, 0, b] == pytest.approx(
            rollout.rewards[0, slot]
            + (0.5 * rollout.rewards[1, slot] if not rollout.truncated[0, slot] | rollout.terminated[0, slot] else 0)
        )
    assert len({tuple(batch.core_state[0, b].tolist()) for b in range(40)}) > 3
