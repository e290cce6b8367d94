"""TD3: its maths against hand-computed numbers, the vectorized step against a loop over members in
plain torch, the delayed actor, inactive members, PBT copies, the actors' policy, and `rlmq up`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlmq.common.algorithms import SACConfig, TD3Config
from rlmq.common.config import RunConfig
from rlmq.common.loading import from_mapping
from rlmq.common.models import DeterministicPolicy, make_policy
from rlmq.common.schema import EnvSpec
from rlmq.learners import checkpoint, sac, td3
from rlmq.learners.offpolicy import ActorCriticHyperparams, Critic
from rlmq.learners.optim import per_member
from rlmq.learners.replay import Transitions

# Uneven bounds: scale (2, 0.5), bias (0, 0.5) — a missing or swapped rescale shows.
SPEC = EnvSpec(obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0))
CPU = torch.device("cpu")


def transitions(population: int, batch: int, seed: int) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    low, high = torch.tensor(SPEC.action_low), torch.tensor(SPEC.action_high)
    return Transitions(
        obs=torch.randn(population, batch, SPEC.obs_size, generator=g),
        actions=low + (high - low) * torch.rand(population, batch, SPEC.action_dim, generator=g),
        rewards=torch.randn(population, batch, generator=g),
        next_obs=torch.randn(population, batch, SPEC.obs_size, generator=g),
        terminated=(torch.rand(population, batch, generator=g) < 0.3).float(),
        horizon=torch.ones(population, batch),
    )


def hyperparams(learning_rates: list[float]) -> ActorCriticHyperparams:
    members = [
        {"learning_rate": lr, "gamma": 0.9 + 0.02 * m, "tau": 0.05 * (m + 1)} for m, lr in enumerate(learning_rates)
    ]
    return per_member(ActorCriticHyperparams, members, CPU)


def no_sync(grad: torch.Tensor) -> None:
    pass


# --- the maths, by hand (P = 2, B = 3) ----------------------------------------------------------


def test_target_smoothing_clips_the_noise_then_the_action() -> None:
    target_action = torch.tensor([[0.1, 0.95, -0.8], [0.0, -0.95, 0.5]]).unsqueeze(-1)
    noise = torch.tensor([[1.0, 0.5, -3.0], [4.0, -1.0, 2.0]]).unsqueeze(-1)
    # σ·ε = [[.2, .1, -.6], [.8, -.2, .4]] → noise clip ±0.5 → [[.2, .1, -.5], [.5, -.2, .4]];
    # sums [[.3, 1.05, -1.3], [.5, -1.15, .9]] → action clip ±1.
    got = td3.smoothed_target_action(target_action, noise, target_noise=0.2, noise_clip=0.5)
    want = torch.tensor([[0.3, 1.0, -1.0], [0.5, -1.0, 0.9]]).unsqueeze(-1)
    torch.testing.assert_close(got, want)


def test_critic_target_takes_the_smaller_twin_and_stops_at_termination() -> None:
    reward = torch.tensor([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]])
    terminated = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    next_q1 = torch.tensor([[2.0, 3.0, 4.0], [1.0, -1.0, 5.0]])
    next_q2 = torch.tensor([[2.5, 1.0, 3.0], [0.0, 2.0, 6.0]])
    horizon = torch.tensor([[1.0, 1.0, 3.0], [1.0, 2.0, 1.0]])
    got = td3.critic_target(reward, terminated, next_q1, next_q2, torch.tensor([0.9, 0.5]), horizon)
    # min = [[2, 1, 3], [0, -1, 5]]: y = r + γ^k·(1 − d)·min, k env steps on (n-step returns)
    torch.testing.assert_close(got, torch.tensor([[1 + 0.9 * 2, 0.0, -1 + 0.9**3 * 3], [0.5, 2 - 0.25, 0.0]]))


def test_critic_and_actor_losses() -> None:
    q1 = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    q2 = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]])
    target = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(td3.critic_loss(q1, q2, target), torch.tensor([5 / 3, 14 / 3]))
    torch.testing.assert_close(
        td3.actor_loss(torch.tensor([[1.0, 2.0, 3.0], [-3.0, 0.0, 0.0]])), torch.tensor([-2.0, 1.0])
    )


def member_modules(algo: td3.TD3, member: int) -> dict[str, torch.nn.Module]:
    """One member's four networks as plain torch modules (a shared critic is every member's)."""
    modules: dict[str, torch.nn.Module] = {}
    for name, stacked, module in (
        ("actor", algo.actor, td3.Actor(SPEC, algo.cfg.hidden_sizes)),
        ("critic", algo.critic, Critic(SPEC, algo.cfg.hidden_sizes)),
        ("target_actor", algo.target_actor, td3.Actor(SPEC, algo.cfg.hidden_sizes)),
        ("target_critic", algo.target_critic, Critic(SPEC, algo.cfg.hidden_sizes)),
    ):
        row = member if stacked.population > 1 else 0
        module.load_state_dict({k: torch.from_numpy(v) for k, v in stacked.member_params(row).items()})
        modules[name] = module
    return modules


def test_td_target_runs_the_target_networks_with_the_given_noise() -> None:
    torch.manual_seed(0)
    algo = td3.TD3(SPEC, TD3Config(hidden_sizes=(8,), target_noise=0.3, noise_clip=0.4), 2, CPU)
    with torch.no_grad():  # targets unlike the online networks: using the wrong ones must show
        algo.target_actor.flat.add_(torch.randn_like(algo.target_actor.flat))
        algo.target_critic.flat.add_(torch.randn_like(algo.target_critic.flat))
    batch = transitions(2, 3, seed=1)
    noise = 2 * torch.randn(2, 3, SPEC.action_dim, generator=torch.Generator().manual_seed(2))
    gamma = torch.tensor([0.9, 0.5])
    got = algo.td_target(batch, gamma, noise)
    for m in range(2):
        nets = member_modules(algo, m)
        with torch.no_grad():
            action = torch.tanh(nets["target_actor"].policy(batch.next_obs[m]))
            action = (action + (0.3 * noise[m]).clamp(-0.4, 0.4)).clamp(-1, 1)
            x = torch.cat([batch.next_obs[m], action], -1)
            q = torch.min(nets["target_critic"].q1(x), nets["target_critic"].q2(x)).squeeze(-1)
        want = batch.rewards[m] + gamma[m] * (1 - batch.terminated[m]) * q
        torch.testing.assert_close(got[m], want, rtol=1e-5, atol=1e-5)


# --- gradient steps -----------------------------------------------------------------------------


def test_vectorized_steps_equal_the_loop_over_members() -> None:
    """Three members with different learning rates, discounts and τ, two of them training, one
    inactive; after 5 steps (policy_delay 2) each active member's four networks and Adam state equal
    those of plain torch modules + torch.optim.Adam stepped by the paper's algorithm; the inactive
    member did not move at all."""
    population, steps, delay = 3, 5, 2
    cfg = TD3Config(hidden_sizes=(16, 16), policy_delay=delay)
    torch.manual_seed(3)
    algo = td3.TD3(SPEC, cfg, population, CPU)
    before = [t.detach().clone() for t in algo.replicated()]
    hp = hyperparams([1e-3, 3e-3, 1e-2])
    active = torch.tensor([True, True, False])
    nets = [member_modules(algo, m) for m in range(population)]
    adams = [
        {
            name: torch.optim.Adam(n[name].parameters(), lr=float(hp.learning_rate[m]), eps=1e-8)
            for name in ("actor", "critic")
        }
        for m, n in enumerate(nets)
    ]
    scale, bias = algo.action_scale, algo.action_bias
    algo_noise, ref_noise = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    for step in range(1, steps + 1):
        batch = transitions(population, 8, seed=10 + step)
        batch = batch._replace(**{f: getattr(batch, f).clone() for f in batch._fields})
        for field in batch:
            field[2] = 0  # the inactive member has no data: zero rows, as the replay hands them out
        stats = algo.step(batch, hp, active, active, no_sync, algo_noise)
        assert all(torch.isfinite(v).all() for v in stats.values())
        noise = torch.randn(population, 8, SPEC.action_dim, generator=ref_noise)
        for m in range(2):
            n, gamma, tau = nets[m], float(hp.gamma[m]), float(hp.tau[m])
            obs, next_obs, actions = batch.obs[m], batch.next_obs[m], (batch.actions[m] - bias) / scale
            with torch.no_grad():
                next_action = torch.tanh(n["target_actor"].policy(next_obs))
                next_action = (
                    next_action + (cfg.target_noise * noise[m]).clamp(-cfg.noise_clip, cfg.noise_clip)
                ).clamp(-1, 1)
                x = torch.cat([next_obs, next_action], -1)
                next_q = torch.min(n["target_critic"].q1(x), n["target_critic"].q2(x)).squeeze(-1)
                y = batch.rewards[m] + gamma * (1 - batch.terminated[m]) * next_q
            x = torch.cat([obs, actions], -1)
            loss = ((n["critic"].q1(x).squeeze(-1) - y) ** 2).mean() + ((n["critic"].q2(x).squeeze(-1) - y) ** 2).mean()
            adams[m]["critic"].zero_grad()
            loss.backward()
            adams[m]["critic"].step()
            if step % delay == 0:
                pi_loss = -n["critic"].q1(torch.cat([obs, torch.tanh(n["actor"].policy(obs))], -1)).mean()
                adams[m]["actor"].zero_grad()
                pi_loss.backward()
                adams[m]["actor"].step()
                with torch.no_grad():
                    for target, online in (("target_actor", "actor"), ("target_critic", "critic")):
                        for t, p in zip(n[target].parameters(), n[online].parameters(), strict=True):
                            t.lerp_(p, tau)
    for m in range(2):
        for name, stacked in (
            ("actor", algo.actor),
            ("critic", algo.critic),
            ("target_actor", algo.target_actor),
            ("target_critic", algo.target_critic),
        ):
            got = stacked.member_params(m)
            for key, want in nets[m][name].state_dict().items():
                np.testing.assert_allclose(
                    got[key], want.numpy(), rtol=1e-4, atol=1e-6, err_msg=f"member {m} {name} {key}"
                )
        for name, want_steps in (("critic", steps), ("actor", steps // delay)):
            optimizer = algo.optimizers[name]
            assert int(optimizer.steps[m]) == want_steps
            params = list(nets[m][name].parameters())
            moments = torch.cat([adams[m][name].state[p]["exp_avg"].reshape(-1) for p in params])
            torch.testing.assert_close(optimizer.exp_avg[m], moments, rtol=1e-4, atol=1e-8)
    for old, new in zip(before, algo.replicated(), strict=True):
        assert torch.equal(old[2], new[2]), "the inactive member moved"
        assert not torch.equal(old[:2], new[:2])
    assert all(int(o.steps[2]) == 0 and not o.exp_avg[2].any() for o in algo.optimizers.values())


def test_the_actor_and_the_targets_move_only_every_policy_delay_steps() -> None:
    torch.manual_seed(4)
    algo = td3.TD3(SPEC, TD3Config(hidden_sizes=(16,), policy_delay=3), 2, CPU)
    hp, active = hyperparams([1e-2, 1e-2]), torch.tensor([True, True])
    moved_at: dict[str, list[int]] = {"actor": [], "critic": [], "target_actor": [], "target_critic": []}
    for step in range(1, 8):
        before = {name: getattr(algo, name).flat.detach().clone() for name in moved_at}
        algo.step(transitions(2, 8, seed=step), hp, active, active, no_sync, torch.Generator().manual_seed(step))
        for name in moved_at:
            if not torch.equal(before[name], getattr(algo, name).flat):
                moved_at[name].append(step)
    assert moved_at == {"actor": [3, 6], "critic": list(range(1, 8)), "target_actor": [3, 6], "target_critic": [3, 6]}


@pytest.mark.parametrize("algo_name", ["td3", "sac"])
def test_the_learning_rate_decays_over_gradient_steps(algo_name: str) -> None:
    """RL-Zoo's linear schedule: decaying over 4 gradient steps equals a constant-rate algorithm
    handed 1, 0.775, 0.55, 0.325, 0.1, 0.1 × the rate step by step (the critics', the actor's and
    SAC's temperature's optimizers alike)."""

    def build(**decay: float) -> td3.TD3 | sac.SAC:
        torch.manual_seed(3)
        if algo_name == "td3":
            return td3.TD3(
                SPEC,
                TD3Config(hidden_sizes=(16,), policy_delay=1, **decay),  # type: ignore[arg-type]
                1,
                CPU,
            )
        return sac.SAC(SPEC, SACConfig(hidden_sizes=(16,), **decay), 1, CPU)  # type: ignore[arg-type]

    decaying, constant = build(lr_decay_steps=4, lr_final_fraction=0.1), build()
    on = torch.tensor([True])
    for step, fraction in enumerate((1.0, 0.775, 0.55, 0.325, 0.1, 0.1)):
        batch = transitions(1, 8, seed=step)
        decaying.step(batch, hyperparams([1e-2]), on, on, no_sync, torch.Generator().manual_seed(step))
        constant.step(batch, hyperparams([1e-2 * fraction]), on, on, no_sync, torch.Generator().manual_seed(step))
    for name in ("actor", "critic"):
        torch.testing.assert_close(getattr(decaying, name).flat, getattr(constant, name).flat)
    if isinstance(decaying, sac.SAC) and isinstance(constant, sac.SAC):
        torch.testing.assert_close(decaying.log_alpha, constant.log_alpha)


def test_a_member_without_data_on_this_rank_adds_zero_gradient() -> None:
    """Under DDP a member may be active with its data on other ranks only: its rows here are zeros,
    and what this rank adds to the averaged gradient must be exactly zero."""
    torch.manual_seed(6)
    algo = td3.TD3(SPEC, TD3Config(hidden_sizes=(16,), policy_delay=1), 2, CPU)
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
    assert len(grads) == 2  # critic, then actor
    for grad in grads:
        assert grad[0].abs().sum() > 0 and not grad[1].any()


def test_copy_member_copies_every_network_and_optimizer_state() -> None:
    torch.manual_seed(5)
    algo = td3.TD3(SPEC, TD3Config(hidden_sizes=(16,), policy_delay=1), 3, CPU)
    hp = hyperparams([1e-3, 2e-3, 3e-3])
    for step in range(3):
        algo.step(
            transitions(3, 8, seed=step),
            hp,
            torch.tensor([True, True, False]),
            torch.tensor([True, True, False]),
            no_sync,
            None,
        )
    states = [
        *(s.flat for s in (algo.actor, algo.critic, algo.target_actor, algo.target_critic)),
        *(t for o in algo.optimizers.values() for t in (o.exp_avg, o.exp_avg_sq, o.steps)),
    ]
    assert all(not torch.equal(t[2], t[0]) for t in states)  # or the copy would prove nothing
    member_1 = [t[1].clone() for t in states]
    algo.copy_member(0, 2)
    assert all(torch.equal(t[2], t[0]) for t in states)
    assert all(torch.equal(t[1], was) for t, was in zip(states, member_1, strict=True))


# --- the actors' policy ---------------------------------------------------------------------------


def test_the_actors_policy_is_the_learners_actor_scaled_to_the_bounds() -> None:
    torch.manual_seed(6)
    algo = td3.TD3(SPEC, TD3Config(hidden_sizes=(16, 16)), 2, CPU)
    with torch.no_grad():
        algo.actor.flat.mul_(4)  # outputs spread over the tanh's range
    run = RunConfig(env_id="Pendulum-v1", algo="td3", td3=TD3Config(exploration_noise=0.3, learning_starts=100))
    obs = np.random.default_rng(0).standard_normal((64, SPEC.obs_size)).astype(np.float32)
    with torch.no_grad():
        want = (
            algo.act(algo.actor, torch.from_numpy(obs)[None].expand(2, -1, -1))[1] * algo.action_scale
            + algo.action_bias
        ).numpy()
    greedy = DeterministicPolicy(algo.member_params(1), SPEC, noise=0.0, warmup=False)
    actions, logp = greedy.act(obs, np.random.default_rng(1))
    assert actions.dtype == np.float32 and logp.shape == (64,)
    np.testing.assert_allclose(actions, want, atol=1e-5)
    assert np.abs(want[:, 0]).max() > 1.0  # the scale matters
    noisy = make_policy(run, algo.member_params(1), SPEC, trained_steps=100)
    assert isinstance(noisy, DeterministicPolicy) and not noisy.warmup and noisy.noise == 0.3
    # An actor whose output is 0 (the middle of the box): what comes out is the noise alone.
    params = algo.member_params(1)
    params["policy.4.weight"][:] = 0
    params["policy.4.bias"][:] = 0
    low, high = np.array(SPEC.action_low), np.array(SPEC.action_high)
    many = np.repeat(obs, 100, axis=0)
    actions, _ = make_policy(run, params, SPEC, trained_steps=100).act(many, np.random.default_rng(2))
    noise = (actions - (low + high) / 2) / ((high - low) / 2)  # in [-1, 1] units
    np.testing.assert_allclose(noise.std(0), [0.3, 0.3], atol=0.015)
    np.testing.assert_allclose(noise.mean(0), [0.0, 0.0], atol=0.015)
    wild, _ = DeterministicPolicy(params, SPEC, noise=2.0, warmup=False).act(many, np.random.default_rng(3))
    assert ((wild >= low) & (wild <= high)).all()  # clipped to the bounds, as the learner stores them
    assert ((wild == low) | (wild == high)).mean() > 0.5
    warmup = make_policy(run, algo.member_params(1), SPEC, trained_steps=99)
    assert isinstance(warmup, DeterministicPolicy) and warmup.warmup
    actions, _ = warmup.act(many, np.random.default_rng(4))
    np.testing.assert_allclose(actions.mean(0), (low + high) / 2, atol=0.05)  # uniform over the box
    np.testing.assert_allclose(actions.min(0), low, atol=0.01)
    np.testing.assert_allclose(actions.max(0), high, atol=0.01)


# --- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("max_steps_per_update", [0, 16])
def test_rlmq_up_trains_td3_on_pendulum(tmp_path: Path, max_steps_per_update: int) -> None:
    """And with the update in chunks: a rollout of 4 × 16 env steps owes 64 gradient steps."""
    config = tmp_path / "td3.json"
    td3 = {"hidden_sizes": [32, 32], "learning_starts": 200, "max_steps_per_update": max_steps_per_update}
    config.write_text(
        json.dumps({"env_id": "Pendulum-v1", "algo": "td3", "num_envs": 4, "rollout_length": 16, "td3": td3})
    )
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
            str(config),
            "--total-steps",
            "2000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = up.communicate(timeout=90)
    assert up.returncode == 0, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "budget" and summary["env_steps"] >= 2000
    assert summary["policy_version"] > 0, "the learner never trained"
    files = checkpoint.Checkpoints(run_dir / "checkpoints", 0, kept=3)
    final = files.load(files.latest())  # written when the world stopped
    versions, rollouts = final["learner"]["versions"][0], final["trainer"]["stored"][0] // 64
    # Without chunks each version took a new rollout; in chunks of 16 steps, about 4 versions do,
    # and the chunks that pay owed steps took no data: the replay holds what was counted, no more.
    assert versions <= rollouts if not max_steps_per_update else versions > 2 * rollouts, (versions, rollouts)
    assert int(final["trainer"]["replay"]["_size"][0]) == final["trainer"]["stored"][0]
    record = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    run = from_mapping(RunConfig, record["run_config"])
    policy = make_policy(
        run,
        {k: v.numpy() for k, v in record["params"].items()},
        from_mapping(EnvSpec, record["env_spec"]),
        trained_steps=2000,
    )
    assert isinstance(policy, DeterministicPolicy) and run.td3.hidden_sizes == (32, 32)
