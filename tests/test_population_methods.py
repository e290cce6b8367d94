"""Population methods beyond PBT on TD3 (issue 44): the critic shared by the members and DvD's
diversity term held to a loop over members in plain torch, a CEM-RL generation taken by the
trainer, `method = "cem"` and `"dvd"` checked where they are configured and shown by `rlmq status`,
and CEM-RL (stopped with Ctrl-C and resumed) and DvD populations through `rlmq up`."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tb  # tests/helpers: conftest puts them on the path
import torch
from procs import in_redis, start_up, stop_with_ctrl_c, wait_for, wait_until_stepping

from rlmq.cli.status import PopulationView, population_lines
from rlmq.common.algorithms import SACConfig, TD3Config
from rlmq.common.config import RunConfig
from rlmq.common.population import CEMConfig, DvDConfig
from rlmq.coordinator.population import Population
from rlmq.coordinator.store import RunStore
from rlmq.learners import checkpoint, sac, td3
from tests.test_td3 import CPU, SPEC, hyperparams, member_modules, no_sync, transitions

# Three TD3 actors around one critic on Pendulum, small enough for a few generations in seconds.
CEM_PENDULUM = {
    "env_id": "Pendulum-v1",
    "algo": "td3",
    "population": 3,
    "num_envs": 2,
    "rollout_length": 16,
    "td3": {"hidden_sizes": [16, 16], "learning_starts": 200, "batch_size": 64, "shared_critic": True},
    "cem": {"elites": 2},
}


@pytest.mark.parametrize("diversity_weight", [0.0, 0.5], ids=["cem-rl", "dvd"])
def test_a_shared_critic_step_equals_the_loop_over_members_around_one_critic(diversity_weight: float) -> None:
    """CEM-RL's and DvD's shape: three actors around one pair of twin critics. Each step the
    shared critic descends the mean of the members' losses (members with data: here 0 and 1),
    each towards its own target actor's smoothed action and γ, at the members' mean learning rate;
    each active actor then ascends the shared Q1 at its own rate, with DvD's λ·(−log det K) over
    every member's actions on the shared states (the first 3 of each member's 8); every target
    moves by its τ, the critic's by the mean τ. Plain torch modules and torch.optim.Adam, one
    member at a time, end where the vectorized step does; a PBT copy leaves the shared critic alone."""
    population, steps, delay, length = 3, 4, 2, 1.5
    cfg = TD3Config(
        hidden_sizes=(16, 16),
        policy_delay=delay,
        shared_critic=True,
        diversity_weight=diversity_weight,
        diversity_length_scale=length,
    )
    torch.manual_seed(4)
    algo = td3.TD3(SPEC, cfg, population, CPU)
    assert algo.critic.population == algo.target_critic.population == 1
    hp = hyperparams([1e-3, 3e-3, 1e-2])
    active = torch.tensor([True, True, False])
    actors = [member_modules(algo, m) for m in range(population)]
    critic, target_critic = member_modules(algo, 0)["critic"], member_modules(algo, 0)["target_critic"]
    actor_adams = [
        torch.optim.Adam(n["actor"].parameters(), lr=float(hp.learning_rate[m]), eps=1e-8) for m, n in enumerate(actors)
    ]
    critic_adam = torch.optim.Adam(critic.parameters(), lr=float(hp.learning_rate.mean()), eps=1e-8)
    scale, bias = algo.action_scale, algo.action_bias
    algo_noise, ref_noise = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)

    def kernel(states: torch.Tensor) -> torch.Tensor:  # DvD's, over every member's actions
        e = torch.stack([torch.tanh(n["actor"].policy(states)).reshape(-1) for n in actors]).double()
        return torch.exp(-(e[:, None] - e[None]).square().mean(-1) / (2 * length**2))

    for step in range(1, steps + 1):
        batch = transitions(population, 8, seed=20 + step)
        batch = batch._replace(**{f: getattr(batch, f).clone() for f in batch._fields})
        for field in batch:
            field[2] = 0
        stats = algo.step(batch, hp, active, active, no_sync, algo_noise)
        assert stats["critic_loss"].shape == (population,)
        noise = torch.randn(population, 8, SPEC.action_dim, generator=ref_noise)
        losses = []
        for m in range(2):
            obs, next_obs, actions = batch.obs[m], batch.next_obs[m], (batch.actions[m] - bias) / scale
            with torch.no_grad():
                next_action = torch.tanh(actors[m]["target_actor"].policy(next_obs))
                next_action = (
                    next_action + (cfg.target_noise * noise[m]).clamp(-cfg.noise_clip, cfg.noise_clip)
                ).clamp(-1, 1)
                x = torch.cat([next_obs, next_action], -1)
                next_q = torch.min(target_critic.q1(x), target_critic.q2(x)).squeeze(-1)
                y = batch.rewards[m] + float(hp.gamma[m]) * (1 - batch.terminated[m]) * next_q
            x = torch.cat([obs, actions], -1)
            losses.append(((critic.q1(x).squeeze(-1) - y) ** 2).mean() + ((critic.q2(x).squeeze(-1) - y) ** 2).mean())
        critic_adam.zero_grad()
        (sum(losses) / 2).backward()
        critic_adam.step()
        if step % delay == 0:
            objective = sum(
                -critic.q1(torch.cat([batch.obs[m], torch.tanh(actors[m]["actor"].policy(batch.obs[m]))], -1)).mean()
                for m in range(2)
            )
            states = batch.obs[:, :3].reshape(-1, SPEC.obs_size)
            k = kernel(states)
            objective = objective - diversity_weight * torch.logdet(k + 1e-6 * torch.eye(population, dtype=k.dtype))
            for adam in actor_adams:
                adam.zero_grad()
            objective.backward()
            for m in range(2):
                actor_adams[m].step()
            if diversity_weight:  # the diversity the actors' step reached
                assert float(stats["diversity"][0]) == pytest.approx(
                    float(torch.det(kernel(states).detach())), rel=1e-4
                )
            with torch.no_grad():
                for m in range(2):
                    for t, p in zip(
                        actors[m]["target_actor"].parameters(), actors[m]["actor"].parameters(), strict=True
                    ):
                        t.lerp_(p, float(hp.tau[m]))
                for t, p in zip(target_critic.parameters(), critic.parameters(), strict=True):
                    t.lerp_(p, float(hp.tau.mean()))
    for name, stacked, want in (("critic", algo.critic, critic), ("target_critic", algo.target_critic, target_critic)):
        for key, value in want.state_dict().items():
            np.testing.assert_allclose(
                stacked.member_params(0)[key], value.numpy(), rtol=1e-4, atol=1e-6, err_msg=f"{name} {key}"
            )
    for m in range(population):
        for name, stacked in (("actor", algo.actor), ("target_actor", algo.target_actor)):
            for key, value in actors[m][name].state_dict().items():
                np.testing.assert_allclose(
                    stacked.member_params(m)[key],
                    value.numpy(),
                    rtol=1e-4,
                    atol=1e-6,
                    err_msg=f"member {m} {name} {key}",
                )
    shared = algo.critic.flat.detach().clone()
    algo.copy_member(source=0, target=2)
    assert torch.equal(algo.actor.flat[2], algo.actor.flat[0]) and torch.equal(algo.critic.flat, shared)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_a_generation_gives_every_member_its_draw_and_trains_only_the_first_ones(algo: str) -> None:
    """CEM-RL's step in the trainer: every actor (TD3's target actor too) becomes its draw, the
    actors' optimizer starts afresh, and the next steps move the `trained` actors alone, while the
    shared critic learns from every member's data."""
    torch.manual_seed(1)
    cfg = {"hidden_sizes": (8,), "shared_critic": True, "policy_delay": 1} if algo == "td3" else {}
    algorithm = (
        td3.TD3(SPEC, TD3Config(**cfg), 3, CPU)
        if algo == "td3"
        else sac.SAC(SPEC, SACConfig(hidden_sizes=(8,), shared_critic=True), 3, CPU)
    )
    hp = hyperparams([1e-3, 1e-3, 1e-3])
    for step in range(3):  # the actors' optimizer has state to forget
        algorithm.step(transitions(3, 8, seed=step), hp, torch.ones(3, dtype=torch.bool), torch.ones(3), no_sync, None)
    draws = [
        {name: np.full_like(value, 0.01 * (m + 1)) for name, value in algorithm.member_params(m).items()}
        for m in range(3)
    ]
    algorithm.start_generation(draws, [True, False, False])
    for m in range(3):
        assert all(np.array_equal(v, draws[m][k]) for k, v in algorithm.member_params(m).items())
    if isinstance(algorithm, td3.TD3):
        assert torch.equal(algorithm.target_actor.flat, algorithm.actor.flat)
    adam = algorithm.optimizers["actor"]
    assert not adam.exp_avg.any() and not adam.exp_avg_sq.any() and not adam.steps.any()
    critic = algorithm.critic.flat.detach().clone()
    for step in range(3):
        algorithm.step(
            transitions(3, 8, seed=10 + step), hp, torch.ones(3, dtype=torch.bool), torch.ones(3), no_sync, None
        )
    moved = [any(not np.array_equal(v, draws[m][k]) for k, v in algorithm.member_params(m).items()) for m in range(3)]
    assert moved == [True, False, False]
    assert not torch.equal(algorithm.critic.flat, critic)


def test_dvds_weight_is_what_the_learners_were_last_sent() -> None:
    """DvD's adaptive λ reaches the loss through a tensor the trainer sets (`set_diversity_weight`):
    at 0 the actors' loss is the loss without the term, at λ it is the configured one's."""
    torch.manual_seed(2)
    cfg = TD3Config(hidden_sizes=(8,), shared_critic=True, diversity_weight=0.5)
    algo, obs = td3.TD3(SPEC, cfg, 3, CPU), transitions(3, 8, seed=3).obs
    with_term = algo.actor_loss(obs, torch.ones(3)).detach()
    algo.diversity_weight.fill_(0.0)
    without = td3.TD3(SPEC, dataclasses.replace(cfg, diversity_weight=0.0), 3, CPU)
    without.actor.flat.data.copy_(algo.actor.flat.data)
    without.critic.flat.data.copy_(algo.critic.flat.data)
    torch.testing.assert_close(algo.actor_loss(obs, torch.ones(3)), without.actor_loss(obs, torch.ones(3)))
    algo.diversity_weight.fill_(0.5)
    torch.testing.assert_close(algo.actor_loss(obs, torch.ones(3)).detach(), with_term)
    assert not torch.equal(with_term, without.actor_loss(obs, torch.ones(3)).detach())


@pytest.mark.slow
def test_rlmq_up_trains_a_cem_population_generation_by_generation_across_a_ctrl_c(tmp_path: Path) -> None:
    """`--method cem`: three TD3 actors drawn around one critic on Pendulum, through `rlmq up`,
    stopped with Ctrl-C after two generations and resumed. Generations follow one another under
    consecutive ids, each judged by its draws' own episodes, those logged before the stop as they
    were; the learner goes on from its checkpoint (the shared critic's steps, the members' trained
    mask) rather than afresh; the run directory holds the generations (lineage.json) and the last
    distribution's mean actor, which `rlmq eval` plays."""
    config = tmp_path / "cem.json"
    config.write_text(json.dumps(CEM_PENDULUM))
    run_dir = tmp_path / "run"
    up = start_up(run_dir, "--actors", "3", "--config", str(config), "--method", "cem", "--total-steps", "1000000")
    store = wait_until_stepping(run_dir, up)
    wait_for(lambda: store.status().learner_applied_decision >= 2, 180, "two generations applied", up)
    stopped_at, saved = stop_with_ctrl_c(up, run_dir)
    before, _, generations = in_redis(run_dir)

    budget = max(9_000, before.env_steps + 4_000)  # two generations and more: each takes ~1,500 env steps here
    argv = ["up", "--resume", str(run_dir), "--actors", "3", "--total-steps", str(budget)]
    resumed = subprocess.run([sys.executable, "-m", "rlmq.cli", *argv], capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from checkpoint {stopped_at}" in (run_dir / "logs" / "learner-0.log").read_text()

    summary = json.loads((run_dir / "summary.json").read_text())
    logged = json.loads((run_dir / "lineage.json").read_text())
    assert summary["pbt_decisions"] == len(logged) > len(generations) >= 2, logged
    assert [g["id"] for g in logged] == [g["generation"] for g in logged] == list(range(1, len(logged) + 1))
    for was, now in zip(generations, logged, strict=False):  # the first session's, as they were logged
        assert (now["id"], now["elites"], now["fitness"]) == (was.id, list(was.elites), was.fitness)
    for g in logged[1:]:  # every member judged by the returns of its draw, the elites the fittest
        fitness = {int(m): v for m, v in g["fitness"].items()}
        assert sorted(fitness) == [0, 1, 2] and all(-2000 < v <= 0 for v in fitness.values())
        assert g["elites"] == sorted(fitness, key=lambda m: (-fitness[m], m))[:2] and g["trained"] == [0, 1]
    files = checkpoint.Checkpoints(run_dir / "checkpoints", 0, kept=3)
    after = files.load(files.latest())
    assert after["learner"]["applied"] > saved["learner"]["applied"] >= 2
    algorithm, then = after["trainer"]["algorithm"], saved["trainer"]["algorithm"]
    assert algorithm["critic_steps"] > then["critic_steps"] > 0  # the shared critic went on learning
    assert algorithm["actor_trained"].tolist() == then["actor_trained"].tolist() == [True, True, False]
    played = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "eval", str(run_dir / "mean.pt"), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert played.returncode == 0 and "member 0" in played.stdout, played.stdout + played.stderr


@pytest.mark.slow
@pytest.mark.parametrize("adaptive", [True], ids=["adaptive"])  # a fixed weight's run: the unit test below
def test_rlmq_up_trains_a_dvd_population_side_by_side_and_reports_its_diversity(tmp_path: Path, adaptive: bool) -> None:
    """`--method dvd`: two TD3 members around one critic with DvD's term, through `rlmq up` on
    Pendulum. No member is copied (where PBT would have decided every 500 env steps of a member),
    and the learners report the members' diversity (det K, in (0, 1]) with their losses. With the
    adaptive weight, the bandit's choices are the run's only decisions, each applied by the learners."""
    config = tmp_path / "dvd.json"
    config.write_text(
        json.dumps(
            {
                "env_id": "Pendulum-v1",
                "algo": "td3",
                "population": 2,
                "total_steps": 6000,
                "num_envs": 4,
                "rollout_length": 16,
                "td3": {
                    "hidden_sizes": [16, 16],
                    "learning_starts": 200,
                    "batch_size": 64,
                    "share_replay": True,
                    "shared_critic": True,
                    "diversity_weight": 0.5,
                },
                "pbt": {"interval": 500, "fitness_episodes": 2},
                "dvd": {"adaptive": adaptive, "interval": 1000},
            }
        )
    )
    run_dir = tmp_path / "run"
    argv = ["up", "--actors", "2", "--config", str(config), "--method", "dvd", "--run-dir", str(run_dir)]
    up = subprocess.run([sys.executable, "-m", "rlmq.cli", *argv], capture_output=True, text=True, timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    choices = json.loads((run_dir / "lineage.json").read_text())
    assert summary["population"] == 2 and summary["pbt_decisions"] == len(choices), summary
    if adaptive:  # one choice per 1 k env steps of the run, once the members have episodes
        assert len(choices) >= 3 and all(c["weight"] in (0.0, 0.5) for c in choices), choices
        applied = (run_dir / "logs" / "learner-0.log").read_text().count("applied DvD weight")
        assert applied >= len(choices) - 1  # the last may come after the learners stopped
    else:
        assert choices == []
    diversity = [value for _, value in tb.scalars(run_dir / "tb")["learner/diversity"]]
    assert diversity and all(0 < value <= 1 for value in diversity), diversity


def test_method_dvd_needs_td3_with_a_shared_critic_and_a_diversity_weight() -> None:
    with pytest.raises(ValueError, match=r"method dvd .* shared_critic = true and diversity_weight > 0"):
        RunConfig(algo="td3", population=3, method="dvd")
    without_term = TD3Config(shared_critic=True, diversity_weight=0.0)  # the population to compare with
    assert RunConfig(algo="td3", population=3, method="dvd", td3=without_term).td3.diversity_weight == 0
    with pytest.raises(ValueError, match="dvd.adaptive chooses between 0 and"):
        RunConfig(algo="td3", population=3, method="dvd", td3=without_term, dvd=DvDConfig(adaptive=True))
    with pytest.raises(ValueError, match="method must be one of pbt, cem, dvd"):
        RunConfig(method="cma")
    dvd = RunConfig(algo="td3", population=3, method="dvd", td3=TD3Config(shared_critic=True, diversity_weight=1.0))
    shown = "\n".join(population_lines(dvd, 0, PopulationView({}, {}, {}, [], 0)))  # `rlmq status`
    assert "population of 3 by dvd" in shown and "PBT decisions: none (method dvd takes none)" in shown
    adaptive = dataclasses.replace(dvd, dvd=DvDConfig(adaptive=True))
    assert "DvD weights: none chosen yet" in "\n".join(population_lines(adaptive, 0, PopulationView({}, {}, {}, [], 0)))


def test_a_dvd_run_with_a_fixed_weight_makes_no_decision_and_pbt_none(redis_url: str, run_id: str) -> None:
    """Where the end-to-end run above is adaptive: with a fixed weight, a DvD population neither
    chooses weights nor copies members, however long its members train."""
    dvd = RunConfig(algo="td3", population=2, method="dvd", td3=TD3Config(shared_critic=True, diversity_weight=0.5))
    population = Population(RunStore.connect(redis_url, run_id), dvd)
    returns = {0: [-900.0] * 10, 1: [-100.0] * 10}
    for steps in (0, 10_000, 100_000):
        population.next_diversity_weight(returns, steps)
        population.tick(returns, steps)
    assert population.weights_log == [] and population.applied == 0


def test_method_cem_needs_sac_or_td3_actors_around_a_shared_critic_and_enough_members() -> None:
    shared = TD3Config(shared_critic=True)
    with pytest.raises(ValueError, match=r"method cem .* shared_critic = true"):
        RunConfig(algo="td3", population=6, method="cem")
    with pytest.raises(ValueError, match=r"method cem .* shared_critic = true"):
        RunConfig(algo="dqn", population=6, method="cem")
    with pytest.raises(ValueError, match=r"at least 2 and of cem.elites \(5\)"):
        RunConfig(algo="td3", population=4, method="cem", td3=shared)
    with pytest.raises(ValueError, match="cem.trained ≤ it"):
        RunConfig(algo="td3", population=6, method="cem", td3=shared, cem=CEMConfig(trained=7))
    with pytest.raises(ValueError, match="normalize_obs = false"):
        RunConfig(algo="td3", population=6, method="cem", td3=shared, normalize_obs=True)
    cem_run = RunConfig(algo="sac", population=6, method="cem", sac=SACConfig(shared_critic=True))
    shown = "\n".join(population_lines(cem_run, 0, PopulationView({}, {}, {}, [], 0)))
    assert "population of 6 by cem" in shown and "CEM generations: none yet" in shown
