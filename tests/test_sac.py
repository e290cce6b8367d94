"""SAC: the loss maths against hand computations, the vectorized step, a 2-rank world, PBT."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlmq.cli.evaluate import load_checkpoint, policy_of
from rlmq.common.algorithms import SACConfig
from rlmq.common.architecture import activation_code
from rlmq.common.schema import EnvSpec
from rlmq.common.transport import free_port
from rlmq.learners import sac
from rlmq.learners.replay import Transitions

PENDULUM = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=1, action_low=(-2.0,), action_high=(2.0,))
HELPER = Path(__file__).parent / "helpers" / "actor_critic_rank.py"


def test_squashed_gaussian_log_probability_is_the_change_of_variables() -> None:
    mean, log_std = torch.tensor([[0.3, -1.0]]), torch.tensor([[-0.5, 0.2]])
    noise = torch.tensor([[1.5, -0.7]])
    action, logp = sac.squashed_gaussian(mean, log_std, noise)
    u = mean + log_std.exp() * noise
    base = torch.distributions.Normal(mean, log_std.exp())
    want = (base.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(logp, want, rtol=1e-5, atol=1e-5)
    # far into the tanh's saturation the naive log(1 − tanh²) is −inf; ours stays finite
    _, saturated = sac.squashed_gaussian(torch.tensor([[30.0]]), torch.tensor([[0.0]]), torch.tensor([[0.0]]))
    assert torch.isfinite(saturated).all()
    _, clamped = sac.squashed_gaussian(torch.zeros(1, 1), torch.tensor([[9.0]]), torch.zeros(1, 1))
    expected = -sac.LOG_STD_MAX - 0.5 * math.log(2 * math.pi)  # log-std clamped to 2; tanh'(0) = 1
    assert float(clamped) == pytest.approx(expected)


def test_losses_by_hand() -> None:
    reward = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    terminated = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    next_q = torch.tensor([[10.0, 10.0], [4.0, -4.0]])
    next_logp = torch.tensor([[-1.0, -1.0], [2.0, 0.0]])
    alpha, gamma = torch.tensor([0.5, 0.1]), torch.tensor([0.9, 0.5])
    horizon = torch.tensor([[1.0, 1.0], [1.0, 2.0]])
    target = sac.critic_target(reward, terminated, next_q, next_logp, alpha, gamma, horizon)
    # member 0: 1 + 0.9·(10 + 0.5) = 10.45; terminated: −2; member 1: 0.5 + 0.5·(4 − 0.2) = 2.4;
    # a 2-step return bootstraps with γ²: 0 + 0.25·(−4) = −1
    torch.testing.assert_close(target, torch.tensor([[10.45, -2.0], [2.4, -1.0]]))
    q1, q2 = torch.tensor([[10.0, -1.0], [2.4, 0.0]]), torch.tensor([[11.0, -2.0], [2.0, -2.0]])
    # ½·(mean((q1 − y)²) + mean((q2 − y)²)) per member
    m0 = 0.5 * ((0.45**2 + 1.0) / 2 + (0.55**2 + 0.0) / 2)
    m1 = 0.5 * ((0.0 + 1.0) / 2 + (0.4**2 + 1.0) / 2)
    torch.testing.assert_close(sac.critic_loss(q1, q2, target), torch.tensor([m0, m1]))
    logp, q = torch.tensor([[-1.0, 1.0], [0.5, 0.5]]), torch.tensor([[2.0, 4.0], [1.0, 3.0]])
    torch.testing.assert_close(sac.actor_loss(logp, q, alpha), torch.tensor([-3.0, -1.95]))
    log_alpha = torch.tensor([0.0, math.log(2.0)])
    # −log α · mean(log π + H̄) with H̄ = −1: member 0 → 0; member 1 → −ln 2 · (−0.5) = 0.3466
    torch.testing.assert_close(sac.temperature_loss(log_alpha, logp, -1.0), torch.tensor([0.0, 0.5 * math.log(2.0)]))


def batch_of(population: int, size: int, seed: int) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    return Transitions(
        obs=torch.randn(population, size, 3, generator=g),
        actions=torch.rand(population, size, 1, generator=g) * 4 - 2,
        rewards=-torch.rand(population, size, generator=g) * 10,
        next_obs=torch.randn(population, size, 3, generator=g),
        terminated=torch.zeros(population, size),
        horizon=torch.ones(population, size),
    )


def test_a_step_moves_active_members_only_and_a_copy_takes_everything() -> None:
    torch.manual_seed(0)
    algo = sac.SAC(PENDULUM, SACConfig(hidden_sizes=(16, 16)), population=3, device=torch.device("cpu"))
    hp = algo.hyperparams(
        [{"learning_rate": lr, "gamma": 0.99, "tau": 0.01} for lr in (1e-3, 3e-3, 1e-2)], torch.device("cpu")
    )
    before = [t.detach().clone() for t in algo.replicated()]
    active, has_data = torch.tensor([True, True, False]), torch.tensor([True, True, False])
    for step in range(5):
        stats = algo.step(batch_of(3, 32, step), hp, active, has_data, lambda grad: None, None)
    assert all(torch.isfinite(v).all() for v in stats.values())
    for tensor, old in zip(algo.replicated(), before, strict=True):
        assert not torch.equal(tensor[0], old[0]) and not torch.equal(tensor[1], old[1])
        assert torch.equal(tensor[2], old[2]), "an inactive member moved"
    # Each step the active members' targets move τ of the way to their critics (Polyak), the others stay.
    target_before = algo.target.flat.detach().clone()
    algo.step(batch_of(3, 32, 5), hp, active, has_data, lambda grad: None, None)
    expected = target_before + 0.01 * (algo.critic.flat.detach() - target_before)
    torch.testing.assert_close(algo.target.flat.detach()[:2], expected[:2], rtol=0, atol=1e-7)
    assert torch.equal(algo.target.flat.detach()[2], target_before[2])
    algo.copy_member(source=1, target=2)
    for tensor in algo.replicated():
        assert torch.equal(tensor[2], tensor[1])
    for optimizer in algo.optimizers.values():
        assert torch.equal(optimizer.exp_avg[2], optimizer.exp_avg[1]) and optimizer.steps[2] == optimizer.steps[1]
        assert torch.equal(optimizer.exp_avg_sq[2], optimizer.exp_avg_sq[1])


def test_a_shared_critic_learns_from_the_mean_of_what_each_members_own_copy_would() -> None:
    """SAC with one critic for three members against SAC with a critic each, all three copies of
    that one: the shared critic's gradient is the mean of the copies' over the members with data
    (0 and 1 here), and each actor's loss through it is what its own copy gives."""
    cpu = torch.device("cpu")
    torch.manual_seed(1)
    shared = sac.SAC(PENDULUM, SACConfig(hidden_sizes=(16, 16), shared_critic=True), population=3, device=cpu)
    own = sac.SAC(PENDULUM, SACConfig(hidden_sizes=(16, 16)), population=3, device=cpu)
    assert shared.critic.population == shared.target.population == 1
    with torch.no_grad():
        own.actor.flat.copy_(shared.actor.flat)
        own.critic.flat.copy_(shared.critic.flat.expand(3, -1))
        own.target.flat.copy_(shared.target.flat.expand(3, -1))
    batch, weight = batch_of(3, 16, 0), torch.tensor([1.0, 1.0, 0.0])
    noise = torch.randn(3, 16, 1, generator=torch.Generator().manual_seed(2))
    alpha, gamma = torch.tensor([0.5, 0.2, 0.1]), torch.tensor([0.99, 0.9, 0.95])
    for algo in (shared, own):
        algo.critic_loss(batch, noise, alpha, gamma, weight).sum().backward()
    assert shared.critic.flat.grad is not None and own.critic.flat.grad is not None
    torch.testing.assert_close(shared.critic.flat.grad[0], own.critic.flat.grad.sum(0) / 2, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        shared.actor_loss(batch.obs, noise, alpha, weight)[0], own.actor_loss(batch.obs, noise, alpha, weight)[0]
    )


@pytest.mark.parametrize("algo", ["sac", "td3-shared"])
def test_two_ranks_keep_every_network_and_optimizer_identical(algo: str, tmp_path: Path) -> None:
    """Each rank samples its own data; every optimizer's gradient is averaged before it steps (a
    critic shared by the members included)."""
    port, outs = free_port(), [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(HELPER), str(r), "2", str(port), str(outs[r]), algo]) for r in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    a, b = (torch.load(o, weights_only=True) for o in outs)
    assert a["moved"] > 0
    for key in a:
        if key != "moved":
            assert torch.equal(a[key], b[key]), f"{key} differs between ranks"


@pytest.mark.slow
def test_a_sac_population_completes_a_pbt_decision_that_mutates_the_network(tmp_path: Path) -> None:
    """With `pbt.activations`, `layer_probability` and `node_probability` at probability 1, the
    copy plays another activation than its source, has one hidden layer more or fewer, and one of
    its layers moves by 8 units: the learners run it (one update for both members), the actors
    and the evaluator build their policies with it from its published (trimmed) weights, and
    `rlmq eval` plays the checkpointed member so."""
    config = tmp_path / "sac-pbt.json"
    config.write_text(
        json.dumps(
            {
                "env_id": "Pendulum-v1",
                "algo": "sac",
                "population": 2,
                "total_steps": 8000,
                "num_envs": 4,
                "rollout_length": 16,
                "sac": {"hidden_sizes": [16, 16], "learning_starts": 200, "batch_size": 64},
                "pbt": {
                    "interval": 2500,
                    "fitness_episodes": 4,
                    "ranges": {"learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}},
                    "activations": ["relu", "elu"],
                    "activation_probability": 1.0,
                    "layer_probability": 1.0,
                    "max_layers": 3,
                    "node_probability": 1.0,
                    "node_steps": [8],
                    "min_width": 8,
                    "max_width": 32,
                },
            }
        )
    )
    run_dir = tmp_path / "run"
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--actors",
            "2",
            "--learners",
            "1",
            "--config",
            str(config),
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    # One decision: a member is judged after 2,500 of its 4,000 env steps, and a copy's returns start afresh.
    assert summary["pbt_decisions"] == 1, summary
    (first, *_) = json.loads((run_dir / "lineage.json").read_text())
    assert first["kind"] == "exploit" and first["target"] != first["source"]
    assert first["previous"]["activation"] == activation_code("relu")  # SAC's, every member's at the start
    assert first["hyperparams"]["activation"] == activation_code("elu")
    assert [first["previous"][f"width.{i}"] for i in range(3)] == [16, 16, 0]
    widths = [first["hyperparams"][f"width.{i}"] for i in range(3)]
    present = [w for w in widths if w > 0]  # one layer added (as wide as the last) or removed ...
    assert len(present) in (1, 3) and widths[len(present) :] == [0] * (3 - len(present)), widths
    assert sorted(abs(w - 16) for w in present) == [0] * (len(present) - 1) + [8]  # ... and one moved by a step
    learner_log = (run_dir / "logs" / "learner-0.log").read_text()
    assert f"applied PBT decision 1: member {first['target']} ← {first['source']}" in learner_log
    checkpoint = load_checkpoint(run_dir, first["target"])
    assert policy_of(checkpoint).activation_name == checkpoint.activation
    # The target's last weights are those of the mutated copy, published trimmed to its widths.
    assert checkpoint.activation == "elu"
    assert [checkpoint.params[f"policy.{2 * i}.weight"].shape[0] for i in range(len(present))] == present
    assert f"policy.{2 * len(present)}.weight" in checkpoint.params  # the output layer, after the last present
    assert f"policy.{2 * len(present) + 2}.weight" not in checkpoint.params
    played = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "eval", str(run_dir), "--member", str(first["target"]), "--episodes", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0, played.stdout + played.stderr


def test_dvd_adds_its_term_over_the_members_squashed_means_on_shared_states() -> None:
    """The actors' loss with DvD's weight λ is the loss without it plus λ·(−log det(K + δI)), K
    the kernel of each member's tanh(mean) on the first ⌈B/P⌉ states of every member's batch,
    written here from plain modules of the members' weights."""
    cpu, length, weight_of_term = torch.device("cpu"), 0.5, 0.3
    algos = []
    for diversity_weight in (weight_of_term, 0.0):
        torch.manual_seed(2)
        cfg = SACConfig(hidden_sizes=(16,), shared_critic=True, diversity_weight=diversity_weight)
        algos.append(sac.SAC(PENDULUM, replace(cfg, diversity_length_scale=length), population=3, device=cpu))
    batch, weight = batch_of(3, 8, 3), torch.tensor([1.0, 1.0, 0.0])
    noise, alpha = torch.randn(3, 8, 1, generator=torch.Generator().manual_seed(4)), torch.tensor([0.2, 0.2, 0.2])
    (with_term, _), (without, _) = (algo.actor_loss(batch.obs, noise, alpha, weight) for algo in algos)
    states = batch.obs[:, :3].reshape(-1, 3)
    means = []
    for m in range(3):
        actor = sac.Actor(PENDULUM, (16,))
        actor.load_state_dict({k: torch.from_numpy(v) for k, v in algos[0].actor.member_params(m).items()})
        means.append(torch.tanh(actor.policy(states).chunk(2, dim=-1)[0]).reshape(-1).double())
    e = torch.stack(means)
    k = torch.exp(-(e[:, None] - e[None]).square().mean(-1) / (2 * length**2)) + 1e-6 * torch.eye(3, dtype=e.dtype)
    want = -weight_of_term * torch.logdet(k)
    assert float((with_term - without).sum()) == pytest.approx(float(want), rel=1e-5)
