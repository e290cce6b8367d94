"""DQN: its maths against hand-computed numbers, the vectorized step against a loop over members in
plain torch, target copies, inactive members, PBT copies, ε-greedy actors, and `rlmq up`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlmq.common.algorithms import DQNConfig
from rlmq.common.config import PBTConfig, RunConfig
from rlmq.common.loading import from_mapping
from rlmq.common.models import EpsilonGreedyPolicy, linear_epsilon, make_policy
from rlmq.common.schema import EnvSpec
from rlmq.learners import dqn, optim
from rlmq.learners.optim import per_member
from rlmq.learners.replay import Transitions

SPEC = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3)
IMAGE = EnvSpec(obs_shape=(2, 5, 6), obs_dtype="bool", action_kind="discrete", action_dim=3)  # MinAtar's encoder
IMAGE_RESNET = EnvSpec(obs_shape=(2, 6, 5), obs_dtype="bool", action_kind="discrete", action_dim=3)  # IMPALA's


def encoder_of(spec: EnvSpec) -> str:
    return "impala" if spec is IMAGE_RESNET else "minatar" if spec is IMAGE else "mlp"


CPU = torch.device("cpu")


def transitions(population: int, batch: int, seed: int, spec: EnvSpec = SPEC) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    return Transitions(
        obs=torch.randn(population, batch, spec.obs_size, generator=g),
        actions=torch.randint(0, spec.action_dim, (population, batch), generator=g),
        rewards=torch.randn(population, batch, generator=g),
        next_obs=torch.randn(population, batch, spec.obs_size, generator=g),
        terminated=(torch.rand(population, batch, generator=g) < 0.3).float(),
        horizon=torch.ones(population, batch),
    )


def hyperparams(learning_rates: list[float]) -> dqn.DQNHyperparams:
    members = [{"learning_rate": lr, "gamma": 0.9 + 0.03 * m} for m, lr in enumerate(learning_rates)]
    return per_member(dqn.DQNHyperparams, members, CPU)


def no_sync(grad: torch.Tensor) -> None:
    pass


# --- the maths, by hand (P = 2, B = 3) ----------------------------------------------------------


def test_double_q_target_picks_with_the_online_net_and_values_with_the_target() -> None:
    next_q_online = torch.tensor([[[1.0, 2.0], [3.0, 0.0], [0.0, 0.5]], [[5.0, 4.0], [-1.0, -2.0], [2.0, 3.0]]])
    next_q_target = torch.tensor([[[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])
    reward = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]])
    terminated = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    one_step = torch.ones_like(reward)
    got = dqn.double_q_target(reward, terminated, next_q_online, next_q_target, torch.tensor([0.9, 0.5]), one_step)
    # argmax online: [1, 0, 1] and [0, 0, 1] → target's values [20, 30, 60] and [1, 3, 6] (its own
    # max would be [20, 40, 60] and [2, 4, 6]); terminated steps keep the reward alone.
    want = torch.tensor([[1 + 0.9 * 20, 0 + 0.9 * 30, -1.0], [0.0, 1 + 0.5 * 3, 2 + 0.5 * 6]])
    torch.testing.assert_close(got, want)
    # n-step transitions: the reward is already the k-step return; the bootstrap is discounted by γ^k.
    horizon = torch.tensor([[2.0, 3.0, 1.0], [1.0, 3.0, 2.0]])
    got = dqn.double_q_target(reward, terminated, next_q_online, next_q_target, torch.tensor([0.9, 0.5]), horizon)
    want = torch.tensor([[1 + 0.81 * 20, 0 + 0.729 * 30, -1.0], [0.0, 1 + 0.125 * 3, 2 + 0.25 * 6]])
    torch.testing.assert_close(got, want)


def test_huber_loss_is_quadratic_inside_one_and_linear_outside() -> None:
    q = torch.tensor([[0.0, 0.5, 3.0], [-2.0, 1.0, 1.0]])
    target = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    # |d| ≤ 1: d²/2; else |d| − 1/2.  Member 0: 0, 0.125, 2.5; member 1: 1.5, 0.5, 0.
    torch.testing.assert_close(dqn.q_loss(q, target), torch.tensor([2.625 / 3, 2.0 / 3]))


def test_epsilon_schedule() -> None:
    assert linear_epsilon(0, 1000, 1.0, 0.05) == 1.0
    assert linear_epsilon(500, 1000, 1.0, 0.05) == pytest.approx(0.525)
    assert linear_epsilon(1000, 1000, 1.0, 0.05) == pytest.approx(0.05)
    assert linear_epsilon(10**9, 1000, 1.0, 0.05) == pytest.approx(0.05)
    assert linear_epsilon(0, 0, 1.0, 0.05) == pytest.approx(0.05)  # exploration_fraction 0
    # Through make_policy: the horizon is fraction × total_steps / population env steps of the member.
    run = RunConfig(
        algo="dqn",
        total_steps=100_000,
        population=2,
        dqn=DQNConfig(exploration_fraction=0.1, exploration_initial_eps=0.9, exploration_final_eps=0.1),
        pbt=PBTConfig(ranges={}),
    )
    params = dqn.DQN(SPEC, run.dqn, 1, CPU).member_params(0)
    for steps, want in ((0, 0.9), (2_500, 0.5), (5_000, 0.1), (50_000, 0.1)):
        policy = make_policy(run, params, SPEC, trained_steps=steps)
        assert isinstance(policy, EpsilonGreedyPolicy) and policy.epsilon == pytest.approx(want), steps


@pytest.mark.parametrize("spec", [SPEC, IMAGE], ids=["vector", "image"])
def test_the_actors_policy_is_greedy_on_the_learners_q_network_but_for_epsilon(spec: EnvSpec) -> None:
    torch.manual_seed(0)
    encoder = encoder_of(spec)
    algo = dqn.DQN(spec, DQNConfig(hidden_sizes=(16, 16)), 2, CPU, encoder)
    with torch.no_grad():  # away from the initialisation, whose Q values barely depend on 0/1 images
        algo.q.flat.add_(0.3 * torch.randn_like(algo.q.flat))
    noise = np.random.default_rng(0).standard_normal((2000, *spec.obs_shape))
    obs = noise > 0 if spec.obs_dtype == "bool" else noise.astype(np.float32)
    with torch.no_grad():
        features = torch.from_numpy(obs.reshape(2000, -1).astype(np.float32))
        greedy = algo.values(algo.q, features[None].expand(2, -1, -1))[1].argmax(-1).numpy()
    assert len(np.unique(greedy)) > 1  # or a constant policy would pass
    actions, logp = EpsilonGreedyPolicy(algo.member_params(1), spec, 0.0, encoder).act(obs, np.random.default_rng(1))
    assert actions.dtype == np.int64 and logp.shape == (2000,)
    np.testing.assert_array_equal(actions, greedy)
    actions, _ = EpsilonGreedyPolicy(algo.member_params(1), spec, 0.3, encoder).act(obs, np.random.default_rng(2))
    # A random action is the greedy one a third of the time: 0.3 × 2/3 of the actions differ.
    assert abs(float((actions != greedy).mean()) - 0.2) < 0.03
    actions, _ = EpsilonGreedyPolicy(algo.member_params(1), spec, 1.0, encoder).act(obs, np.random.default_rng(3))
    np.testing.assert_allclose(np.bincount(actions, minlength=3) / len(obs), [1 / 3] * 3, atol=0.04)


# --- gradient steps -----------------------------------------------------------------------------


def member_modules(algo: dqn.DQN, member: int, spec: EnvSpec, encoder: str) -> tuple[dqn.QNetwork, dqn.QNetwork]:
    nets = []
    for stacked in (algo.q, algo.target):
        net = dqn.QNetwork(spec, algo.cfg.hidden_sizes, encoder)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in stacked.member_params(member).items()})
        nets.append(net)
    return nets[0], nets[1]


@pytest.mark.parametrize("spec", [SPEC, IMAGE, IMAGE_RESNET], ids=["vector", "image", "resnet"])
def test_vectorized_steps_equal_the_loop_over_members(spec: EnvSpec) -> None:
    """Three members with different learning rates and discounts, two training, one inactive; after
    7 steps (target copied every 3, gradients clipped to norm 0.5) each active member's Q and target
    networks and Adam state equal those of plain torch modules + Adam + clip_grad_norm_; the
    inactive member did not move at all."""
    population, steps, interval = 3, 7, 3
    cfg = DQNConfig(hidden_sizes=(16, 16), target_update_interval=interval, max_grad_norm=0.5)
    torch.manual_seed(3)
    encoder = encoder_of(spec)
    algo = dqn.DQN(spec, cfg, population, CPU, encoder)
    before = [t.detach().clone() for t in algo.replicated()]
    hp = hyperparams([1e-3, 3e-3, 1e-2])
    active = torch.tensor([True, True, False])
    nets = [member_modules(algo, m, spec, encoder) for m in range(2)]
    adams = [torch.optim.Adam(q.parameters(), lr=float(hp.learning_rate[m]), eps=1e-8) for m, (q, _) in enumerate(nets)]
    clipped = 0
    for step in range(1, steps + 1):
        batch = transitions(population, 16, seed=10 + step, spec=spec)
        for field in batch:
            field[2] = 0  # the inactive member has no data: zero rows, as the replay hands them out
        stats = algo.step(batch, hp, active, active, no_sync, None)
        assert all(torch.isfinite(v).all() for v in stats.values())
        for m, (q, target) in enumerate(nets):
            with torch.no_grad():
                best = q(batch.next_obs[m]).argmax(-1, keepdim=True)
                next_value = target(batch.next_obs[m]).gather(-1, best).squeeze(-1)
                y = batch.rewards[m] + float(hp.gamma[m]) * (1 - batch.terminated[m]) * next_value
            taken = q(batch.obs[m]).gather(-1, batch.actions[m].unsqueeze(-1)).squeeze(-1)
            adams[m].zero_grad()
            torch.nn.functional.smooth_l1_loss(taken, y).backward()
            clipped += float(torch.nn.utils.clip_grad_norm_(q.parameters(), 0.5)) > 0.5
            adams[m].step()
            if step % interval == 0:
                target.load_state_dict(q.state_dict())
    assert clipped > 0, "clipping never acted: the test would not see it missing"
    atol = 1e-5 if spec is IMAGE_RESNET else 1e-6  # 15 layers of float32 roundings (a wrong step moves ~1e-3)
    for m, (q, target) in enumerate(nets):
        for stacked, net in ((algo.q, q), (algo.target, target)):
            got = stacked.member_params(m)
            for key, want in net.state_dict().items():
                np.testing.assert_allclose(got[key], want.numpy(), rtol=1e-4, atol=atol, err_msg=f"member {m} {key}")
        moments = torch.cat([adams[m].state[p]["exp_avg"].reshape(-1) for p in q.parameters()])
        # (behind an encoder, gradients summed in another order than a member's own: float32 roundings)
        torch.testing.assert_close(
            algo.optimizers["q"].exp_avg[m], moments, rtol=1e-4, atol=1e-7 if algo.q.image else 1e-8
        )
        assert int(algo.optimizers["q"].steps[m]) == steps
    for old, new in zip(before, algo.replicated(), strict=True):
        assert torch.equal(old[2], new[2]), "the inactive member moved"
        assert not torch.equal(old[:2], new[:2])
    assert int(algo.optimizers["q"].steps[2]) == 0 and not algo.optimizers["q"].exp_avg[2].any()


def test_the_target_is_a_hard_copy_every_interval() -> None:
    torch.manual_seed(4)
    algo = dqn.DQN(SPEC, DQNConfig(hidden_sizes=(16,), target_update_interval=3), 2, CPU)
    hp, active = hyperparams([1e-2, 1e-2]), torch.tensor([True, True])
    for step in range(1, 8):
        target_before = algo.target.flat.detach().clone()
        algo.step(transitions(2, 8, seed=step), hp, active, active, no_sync, None)
        if step % 3 == 0:
            assert torch.equal(algo.target.flat, algo.q.flat), step
        else:
            assert torch.equal(algo.target.flat, target_before) and not torch.equal(algo.target.flat, algo.q.flat), step


def test_a_soft_target_moves_by_tau_every_interval() -> None:
    torch.manual_seed(4)
    algo = dqn.DQN(SPEC, DQNConfig(hidden_sizes=(16,), target_update_interval=2, tau=0.25), 2, CPU)
    hp, active = hyperparams([1e-2, 1e-2]), torch.tensor([True, False])
    for step in range(1, 5):
        target_before = algo.target.flat.detach().clone()
        algo.step(transitions(2, 8, seed=step), hp, active, active, no_sync, None)
        want = target_before.clone()
        if step % 2 == 0:  # only the active member's target moves
            want[0] = 0.75 * target_before[0] + 0.25 * algo.q.flat[0].detach()
        torch.testing.assert_close(algo.target.flat, want)
    assert not torch.equal(algo.target.flat[0], algo.q.flat[0])


def test_the_learning_rate_decays_linearly_per_member_then_stays() -> None:
    steps = torch.tensor([0.0, 50.0, 100.0, 400.0])
    torch.testing.assert_close(optim.decayed_fraction(steps, 100, 0.1), torch.tensor([1.0, 0.55, 0.1, 0.1]))
    torch.testing.assert_close(optim.decayed_fraction(steps, 0, 0.1), torch.ones(4))
    # Through steps: decaying over 4 steps equals a constant-rate DQN handed 1, 0.775, 0.55, 0.325,
    # 0.1, 0.1 × the rate step by step.
    nets = []
    for decay in (4, 0):
        torch.manual_seed(7)
        nets.append(dqn.DQN(SPEC, DQNConfig(hidden_sizes=(16,), lr_decay_steps=decay, lr_final_fraction=0.1), 1, CPU))
    on = torch.tensor([True])
    for step, fraction in enumerate((1.0, 0.775, 0.55, 0.325, 0.1, 0.1)):
        nets[0].step(transitions(1, 8, seed=step), hyperparams([1e-2]), on, on, no_sync, None)
        nets[1].step(transitions(1, 8, seed=step), hyperparams([1e-2 * fraction]), on, on, no_sync, None)
    torch.testing.assert_close(nets[0].q.flat, nets[1].q.flat)


def test_a_member_without_data_on_this_rank_adds_zero_gradient() -> None:
    """Under DDP a member may be active with its data on other ranks only: its rows here are zeros,
    and what this rank adds to the averaged gradient must be exactly zero."""
    torch.manual_seed(6)
    algo = dqn.DQN(SPEC, DQNConfig(hidden_sizes=(16,)), 2, CPU)
    batch = transitions(2, 8, seed=0)
    batch = Transitions(*(torch.stack([t[0], torch.zeros_like(t[1])]) for t in batch))
    grads: list[torch.Tensor] = []
    algo.step(
        batch,
        hyperparams([1e-3, 1e-3]),
        torch.tensor([True, True]),
        torch.tensor([True, False]),
        lambda grad: grads.append(grad.clone()),
        None,
    )
    (grad,) = grads
    assert grad[0].abs().sum() > 0 and not grad[1].any()


def test_copy_member_copies_both_networks_and_the_optimizer_state() -> None:
    torch.manual_seed(5)
    algo = dqn.DQN(SPEC, DQNConfig(hidden_sizes=(16,), target_update_interval=2), 3, CPU)
    hp, active = hyperparams([1e-3, 2e-3, 3e-3]), torch.tensor([True, True, False])
    for step in range(3):
        algo.step(transitions(3, 8, seed=step), hp, active, active, no_sync, None)
    optimizer = algo.optimizers["q"]
    states = [algo.q.flat, algo.target.flat, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps]
    assert all(not torch.equal(t[2], t[0]) for t in states)  # or the copy would prove nothing
    member_1 = [t[1].clone() for t in states]
    algo.copy_member(0, 2)
    assert all(torch.equal(t[2], t[0]) for t in states)
    assert all(torch.equal(t[1], was) for t, was in zip(states, member_1, strict=True))


# --- end to end -----------------------------------------------------------------------------------


CONFIG = Path(__file__).parents[1] / "configs" / "dqn-cartpole.toml"  # n-step returns, the tuned settings


@pytest.mark.slow
def test_rlmq_up_trains_dqn_on_cartpole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--run-dir",
            str(run_dir),
            "--actors",
            "2",
            "--learners",
            "1",
            "--config",
            str(CONFIG),
            "--total-steps",
            "3000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = up.communicate(timeout=90)
    assert up.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "budget" and summary["env_steps"] >= 3000
    assert summary["policy_version"] > 0, "the learner never trained"
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    run = from_mapping(RunConfig, checkpoint["run_config"])
    policy = make_policy(
        run,
        {k: v.numpy() for k, v in checkpoint["params"].items()},
        from_mapping(EnvSpec, checkpoint["env_spec"]),
        trained_steps=3000,
    )
    assert isinstance(policy, EpsilonGreedyPolicy) and policy.epsilon == pytest.approx(run.dqn.exploration_final_eps)
    assert run.dqn.n_step == 3, "the shipped config's n-step returns went through the run"
