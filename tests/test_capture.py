"""The captured (torch.compile) update against the eager one it must equal (learners/capture.py).

On the CPU the capture is traced with the "aot_eager" backend: the same graphs, forward and
backward, run with eager kernels, in seconds. Inductor's generated kernels take tens of seconds
to build here, so on the CPU benchmarks/bench_capture.py compares (and times) them; where CUDA is
present they are tested here, replayed as CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from ddp_rank import SLOTS, SPEC, STEPS
from ddp_rank import rollout as ddp_rollout
from ppo_batches import CONTINUOUS, CUDA, DISCRETE, IMAGE, random_batch
from torch._dynamo.utils import counters

from rlmq.common.algorithms import ALGORITHMS, DQNConfig, PPOConfig, SACConfig, TD3Config
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import capture, dqn, minibatching, ppo, sac, td3
from rlmq.learners.networks import PopulationActorCritic
from rlmq.learners.offpolicy import allreduce_mean
from rlmq.learners.optim import PopulationAdam, clip_and_step, clip_then_step, per_member
from rlmq.learners.replay import Transitions
from rlmq.learners.trainers import make_trainer

POPULATION = 3
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_compiler_caches() -> None:
    torch._dynamo.reset()  # each test compiles afresh, within the recompile limit
    counters.clear()


def members(device: str) -> ppo.MemberHyperparams:
    return per_member(
        ppo.MemberHyperparams,
        [
            {
                **dict.fromkeys(ALGORITHMS["ppo"].tunable, 0.2),
                "learning_rate": lr,
                "gamma": 0.99,
                "gae_lambda": 0.95,
                "ent_coef": 0.01 * m,
                "max_grad_norm": 0.5 + m,
            }
            for m, lr in enumerate((1e-3, 3e-3, 1e-2))
        ],
        torch.device(device),
    )


def train(
    spec: EnvSpec, device: str, captured: ppo.CapturedSteps | None, minibatches: int = 2
) -> tuple[PopulationActorCritic, PopulationAdam]:
    """Three updates of 2 epochs × `minibatches` from the same start and data; member 2 has data in
    the first update only (then inactive, with momentum)."""
    torch.manual_seed(3)
    core = PopulationActorCritic(spec, (16, 16), POPULATION, encoder="minatar" if len(spec.obs_shape) == 3 else "mlp")
    core = core.to(device)
    optimizer = PopulationAdam(core.flat)
    cfg = PPOConfig(epochs=2, minibatches=minibatches)
    for step in range(3):
        batch = ppo.Batch(*(t.to(device) for t in random_batch(spec, POPULATION, 6, 5, seed=10 + step)))
        if step > 0:
            batch.valid[2] = False
        active = batch.valid.flatten(1).any(1)
        norm = ppo.loss_normalizers(batch.valid.flatten(1).sum(1), cfg.minibatches, world_size=1)
        plan = [
            None if i is None else i.to(device)
            for i in minibatching.minibatch_plan(6 * 5, cfg, torch.Generator().manual_seed(step))
        ]
        anneal = torch.tensor([1.0, 0.5, 0.8], device=device)
        ppo.update(core, core, optimizer, batch, members(device), cfg, plan, anneal, norm, active, captured)
    return core, optimizer


def assert_same_training(spec: EnvSpec, device: str, mode: str, backend: str, minibatches: int = 2) -> None:
    torch._dynamo.reset()
    counters.clear()
    eager = train(spec, device, None, minibatches)
    captured = train(spec, device, ppo.capture(mode, allreduce_mean, backend), minibatches)
    # Compiled whole: the loss (forward and backward) and the step, each one graph ("cuda-graphs"
    # compiles nothing).
    graphs = 0 if capture.KERNELS[mode] is None else 2
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == graphs, {
        k: dict(v) for k, v in counters.items()
    }
    for (name, want), got in zip(
        {"flat": eager[0].flat.detach(), "exp_avg": eager[1].exp_avg, "exp_avg_sq": eager[1].exp_avg_sq}.items(),
        (captured[0].flat.detach(), captured[1].exp_avg, captured[1].exp_avg_sq),
        strict=True,
    ):
        # Fused kernels sum in other orders than eager ones: float32 roundings, which Adam's steps
        # (lr up to 1e-2) carry into the weights.
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    # inactive after one update
    assert torch.equal(captured[1].steps, eager[1].steps) and int(captured[1].steps[2]) == 2 * minibatches


@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS, IMAGE], ids=["discrete", "continuous", "image"])
def test_the_captured_update_equals_the_eager_one(spec: EnvSpec) -> None:
    assert_same_training(spec, "cpu", "default", "aot_eager")


def test_whole_batch_epochs_and_the_captured_path_with_eager_kernels_train_as_the_eager_update_does() -> None:
    """One minibatch per epoch (its advantages normalized inside the graph, where the eager path
    normalizes them once); and "cuda-graphs", whose parts run eager kernels (on a CPU, unreplayed):
    the gradient taken inside the loss's part, not by the caller's backward."""
    assert_same_training(DISCRETE, "cpu", "default", "aot_eager", minibatches=1)
    assert_same_training(CONTINUOUS, "cpu", "cuda-graphs", "")


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_trainer_with_compile_update_trains_as_an_eager_one(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run config's switch reaches the update, single rank: the trainers as the learner makes them."""
    monkeypatch.setattr(capture, "BACKEND", "aot_eager")
    trained = []
    for mode in ("off", "default"):
        torch.manual_seed(0)
        run_config = RunConfig(
            algo=algo,
            compile_update=mode,
            num_envs=SLOTS,
            rollout_length=STEPS,
            hidden_sizes=SMALL,
            dqn=DQNConfig(hidden_sizes=SMALL, learning_starts=0, batch_size=32),
        )
        trainer = make_trainer(SPEC, run_config, (), 0, 1, CPU)
        trainer.set_hyperparams([run_config.base_hyperparams()])
        rng = np.random.default_rng(1)
        for _ in range(3):
            rollout = ddp_rollout(rng, 0)
            trainer.train([[rollout]], [int(rollout.valid.sum())], 1)
        trained.append(trainer.member_params(0))
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] >= 2, "nothing was captured whole"
    eager, captured = trained
    assert eager.keys() == captured.keys()
    for name, want in eager.items():
        np.testing.assert_allclose(captured[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@CUDA
@pytest.mark.parametrize("mode", ["cuda-graphs", "reduce-overhead"])
@pytest.mark.parametrize("spec", [DISCRETE, CONTINUOUS, IMAGE], ids=["discrete", "continuous", "image"])
def test_cuda_graphs_train_as_the_eager_update_does(spec: EnvSpec, mode: str) -> None:
    """Replayed CUDA graphs of eager kernels ("cuda-graphs") and of inductor's ("reduce-overhead")."""
    assert_same_training(spec, "cuda", mode, "inductor")


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_captured_step_skips_and_counts_as_the_eager_one(backend: str) -> None:
    """Member 0's gradient is not finite, member 2 is inactive: both keep their weights and moments."""
    param = torch.nn.Parameter(torch.randn(POPULATION, 40, generator=torch.Generator().manual_seed(0)))
    results = []
    for step in (clip_then_step, capture.compiled(clip_and_step, "default", backend)):
        optimizer = PopulationAdam(torch.nn.Parameter(param.detach().clone()))
        active, max_norm, lr = torch.tensor([True, True, False]), torch.tensor([1.0, 0.5, 1.0]), torch.full((3,), 1e-2)
        for i in range(2):
            grad = torch.randn(POPULATION, 40, generator=torch.Generator().manual_seed(1 + i)) * 3
            grad[0, 5] = float("inf") if i == 0 else 1.0
            optimizer.param.grad = grad
            step(optimizer, max_norm, lr, active)
        results.append(optimizer)
    eager, captured = results
    assert int(captured.nonfinite) == int(eager.nonfinite) == 1
    assert torch.equal(captured.steps, eager.steps) and captured.steps.tolist() == [1, 2, 0]
    torch.testing.assert_close(captured.param.detach(), eager.param.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(captured.param.detach()[2], param.detach()[2])


def test_a_run_config_names_a_compile_mode_that_exists() -> None:
    assert RunConfig(compile_update="reduce-overhead").compile_update == "reduce-overhead"
    with pytest.raises(ValueError, match="compile_update must be one of off, default"):
        RunConfig(compile_update="fast")


# --- the off-policy algorithms ----------------------------------------------------------------

BOUNDED = EnvSpec(
    obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
)
SMALL = (16, 16)
OFF_POLICY = {  # P = 3 members, each algorithm as small as it comes, on a device
    "sac": lambda d: sac.SAC(BOUNDED, SACConfig(hidden_sizes=SMALL), POPULATION, d),
    "sac-shared": lambda d: sac.SAC(BOUNDED, SACConfig(hidden_sizes=SMALL, shared_critic=True), POPULATION, d),
    "td3": lambda d: td3.TD3(BOUNDED, TD3Config(hidden_sizes=SMALL), POPULATION, d),
    "td3-dvd": lambda d: td3.TD3(
        BOUNDED, TD3Config(hidden_sizes=SMALL, shared_critic=True, diversity_weight=0.5), POPULATION, d
    ),
    "dqn": lambda d: dqn.DQN(
        DISCRETE, DQNConfig(hidden_sizes=SMALL, max_grad_norm=1.0, target_update_interval=2), POPULATION, d
    ),
    "dqn-image": lambda d: dqn.DQN(
        IMAGE, DQNConfig(hidden_sizes=SMALL, target_update_interval=2), POPULATION, d, "minatar"
    ),
}


def transitions(spec: EnvSpec, seed: int) -> Transitions:
    g, shape = torch.Generator().manual_seed(seed), (POPULATION, 32)
    if spec.action_kind == "discrete":
        actions = torch.randint(0, spec.action_dim, shape, generator=g)
    else:
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        actions = low + (high - low) * torch.rand(*shape, spec.action_dim, generator=g)
    return Transitions(
        obs=torch.randn(*shape, spec.obs_size, generator=g),
        actions=actions,
        rewards=torch.randn(shape, generator=g),
        next_obs=torch.randn(*shape, spec.obs_size, generator=g),
        terminated=(torch.rand(shape, generator=g) < 0.3).float(),
        horizon=torch.ones(shape),
    )


@pytest.mark.parametrize("mode", ["default", "cuda-graphs"])
@pytest.mark.parametrize("name", list(OFF_POLICY))
def test_captured_off_policy_steps_equal_the_eager_ones(name: str, mode: str) -> None:
    """Four gradient steps (TD3's actor and targets move on two of them, DQN's target too) from the
    same start on the same data and noise; member 2 holds no data on this rank after the first,
    and is inactive after the second. "cuda-graphs" on a CPU: each loss takes its own gradient."""
    assert_same_off_policy_steps(name, CPU, mode, "aot_eager")
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] >= (2 if mode == "default" else 0), "nothing was captured"


@CUDA
@pytest.mark.parametrize("mode", ["cuda-graphs", "reduce-overhead"])
@pytest.mark.parametrize("name", list(OFF_POLICY))
def test_cuda_graphs_of_off_policy_steps_equal_the_eager_ones(name: str, mode: str) -> None:
    assert_same_off_policy_steps(name, torch.device("cuda"), mode, "inductor")


def assert_same_off_policy_steps(name: str, device: torch.device, mode: str, backend: str) -> None:
    trained = []
    for captured_side in (False, True):
        torch.manual_seed(0)
        algorithm = OFF_POLICY[name](device)
        if captured_side:
            algorithm.capture(mode, backend)
        spec = (
            IMAGE if name == "dqn-image" else BOUNDED if name in ("sac", "sac-shared", "td3", "td3-dvd") else DISCRETE
        )
        hp = algorithm.hyperparams(
            [{"learning_rate": 1e-2 * (m + 1), "gamma": 0.9, "tau": 0.1} for m in range(POPULATION)], device
        )
        generator = torch.Generator(device).manual_seed(7)
        for i in range(4):
            has_data = torch.tensor([True, True, i == 0], device=device)
            active = torch.tensor([True, True, i <= 1], device=device)
            batch = Transitions(*(t.to(device) for t in transitions(spec, i)))
            algorithm.step(batch, hp, active, has_data, allreduce_mean, generator)
        trained.append(algorithm)
    eager, captured = trained
    # Inductor's fused kernels on a GPU sum in other orders: over four Adam steps at lr up to 3e-2,
    # one weight in TD3's 2,310 was seen 2.5e-5 away.
    atol = 1e-4 if device.type == "cuda" and capture.KERNELS[mode] else 1e-5
    for want, got in zip(eager.replicated(), captured.replicated(), strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-4, atol=atol)
    for key, optimizer in eager.optimizers.items():
        other = captured.optimizers[key]
        torch.testing.assert_close(other.exp_avg_sq, optimizer.exp_avg_sq, rtol=1e-4, atol=1e-8)
        assert torch.equal(other.steps, optimizer.steps), key
        if len(other.steps) == POPULATION:  # not a critic the members share
            assert (
                other.steps.tolist() == [other.steps[0].item()] * 2 + [other.steps[2].item()]
                and other.steps[2] < other.steps[0]
            ), f"{key}: member 2 stepped while inactive"
