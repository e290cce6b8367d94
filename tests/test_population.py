"""The vectorized population update against the loop over members it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ppo_batches import (
    CONTINUOUS,
    CUDA,
    DISCRETE,
    IMAGE,
    IMAGE_CONTINUOUS,
    IMAGE_RESNET,
    random_batch,
)

from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS, PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec
from rlmq.learners import minibatching, ppo, stacked_mlp
from rlmq.learners.networks import ActorCritic, PopulationActorCritic, Stacked
from rlmq.learners.offpolicy import OffPolicyTrainer
from rlmq.learners.onpolicy import copy_member
from rlmq.learners.optim import FUSED_ROW_MIN, PopulationAdam, per_member
from rlmq.learners.stacked_mlp import Activation
from rlmq.learners.trainers import make_trainer
from tests.helpers.references import update_each_member

TUNABLE = ALGORITHMS["ppo"].tunable


def encoder_of(spec: EnvSpec) -> str:
    if spec is IMAGE_RESNET:
        return "impala"
    return "minatar" if len(spec.obs_shape) == 3 else "mlp"


def stacked_from(nets: list[ActorCritic], spec: EnvSpec, activation: Activation = "tanh") -> PopulationActorCritic:
    pop = PopulationActorCritic(spec, (16, 16), len(nets), encoder=encoder_of(spec), activation=activation)
    for m, net in enumerate(nets):
        pop.load_member(m, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    return pop


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize(
    "spec", [DISCRETE, CONTINUOUS, IMAGE, IMAGE_CONTINUOUS], ids=["discrete", "continuous", "image", "image-continuous"]
)
def test_stacked_forward_is_each_members_forward(spec: EnvSpec, activation: Activation) -> None:
    torch.manual_seed(0)
    nets = [ActorCritic(spec, (16, 16), encoder=encoder_of(spec), activation=activation) for _ in range(3)]
    for net in nets[1:]:  # members must differ, or a mixed-up member axis would go unseen
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.3 * torch.randn_like(p))
    pop = stacked_from(nets, spec, activation)
    batch = random_batch(spec, 3, 5, 4, seed=1)
    obs, actions = batch.obs[:, :-1].reshape(3, 20, -1), batch.actions.reshape(3, 20, *batch.actions.shape[3:])
    logp, entropy, value = pop(obs, actions)
    for m, net in enumerate(nets):
        ref = net(obs[m], actions[m])
        for got, want in zip((logp[m], entropy[m], value[m]), ref, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        params = pop.member_params(m)
        assert all(np.array_equal(params[k], v.detach().numpy()) for k, v in net.state_dict().items())


def test_members_initialise_as_single_agents_do() -> None:
    torch.manual_seed(7)
    single = ActorCritic(DISCRETE, (16, 16))
    torch.manual_seed(7)
    pop = PopulationActorCritic(DISCRETE, (16, 16), 3)
    assert all(np.array_equal(pop.member_params(0)[k], v.detach().numpy()) for k, v in single.state_dict().items())
    assert not np.array_equal(pop.member_params(1)["policy.0.weight"], pop.member_params(0)["policy.0.weight"])


def test_tensors_cut_by_one_split_are_the_named_views_and_carry_their_gradients() -> None:
    """`Stacked.tensors` (one split of a stretch of `flat`) against `tensor` (a slice each): the
    same views of the same memory, and a loss through them leaves the same gradient in `flat`."""
    torch.manual_seed(0)
    pop = PopulationActorCritic(IMAGE, (16, 16), 3, encoder="minatar")
    names = ["value.0.weight", "encoder.0.bias", "value.0.bias"]  # out of order, a gap between
    cut = pop.tensors(names)
    for name, got in zip(names, cut, strict=True):
        want = pop.tensor(name)
        assert got.shape == want.shape and got.data_ptr() == want.data_ptr() and torch.equal(got, want)
    weights = [torch.randn(t.shape) for t in cut]
    torch.stack([(w * t).sum() for w, t in zip(weights, cut, strict=True)]).sum().backward()
    by_split, pop.flat.grad = pop.flat.grad, None
    torch.stack([(w * pop.tensor(n)).sum() for w, n in zip(weights, names, strict=True)]).sum().backward()
    assert by_split is not None and pop.flat.grad is not None
    assert torch.equal(by_split, pop.flat.grad) and bool((by_split != 0).any())


@pytest.fixture(params=["numpy", "torch"])
def cpu_matmul(request: pytest.FixtureRequest) -> str:
    """Both libraries the stacked MLPs' matmuls run in on the CPU; NumPy at every size here (these
    batches are under the size that picks it in a learner)."""
    stacked_mlp.use_cpu_matmul(request.param, min_macs=0)
    request.addfinalizer(lambda: stacked_mlp.use_cpu_matmul("numpy"))
    return str(request.param)


@pytest.mark.parametrize(
    "spec,minibatches,device,normalize",
    [
        (DISCRETE, 2, "cpu", True),
        (CONTINUOUS, 1, "cpu", True),
        (CONTINUOUS, 2, "cpu", False),
        (IMAGE, 2, "cpu", True),
        (IMAGE_CONTINUOUS, 1, "cpu", True),
        (IMAGE_RESNET, 2, "cpu", True),
        pytest.param(DISCRETE, 2, "cuda", True, marks=CUDA),
        pytest.param(CONTINUOUS, 1, "cuda", True, marks=CUDA),
        pytest.param(IMAGE, 2, "cuda", True, marks=CUDA),
    ],
    ids=[
        "discrete-2mb",
        "continuous",
        "continuous-raw-advantages",
        "image-2mb",
        "image-continuous",
        "resnet-2mb",
        "discrete-2mb-cuda",
        "continuous-cuda",
        "image-2mb-cuda",
    ],
)
def test_vectorized_update_equals_the_loop_over_members(
    spec: EnvSpec, minibatches: int, device: str, normalize: bool, cpu_matmul: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four members with different learning rates, clip ranges, discounts and anneal fractions;
    one of them inactive after its first update (no data): after several updates each member's
    weights and Adam moments equal those of its own ActorCritic + torch.optim.Adam +
    clip_grad_norm_."""
    # cuDNN's convolutions run in TF32 by default on GPUs that have it (~1e-3 relative): the
    # comparison is of the arithmetic, in float32.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    population = 4
    torch.manual_seed(3)
    pop = PopulationActorCritic(spec, (16, 16), population, encoder=encoder_of(spec)).to(device)
    nets = []
    for m in range(population):
        net = ActorCritic(spec, (16, 16), encoder=encoder_of(spec))
        net.load_state_dict({k: torch.from_numpy(v) for k, v in pop.member_params(m).items()})
        nets.append(net.to(device))
    adams = [torch.optim.Adam(net.parameters(), lr=1.0, eps=1e-5) for net in nets]
    optimizer = PopulationAdam(pop.flat)
    members = [
        {
            "learning_rate": lr,
            "ent_coef": 0.01 * m,
            "clip_coef": 0.1 + 0.05 * m,
            "vf_coef": 0.5,
            "gamma": 0.9 + 0.03 * m,
            "gae_lambda": 0.95 - 0.1 * m,
            "max_grad_norm": 0.5 + m,
        }
        for m, lr in enumerate((1e-3, 3e-3, 1e-2, 3e-4))
    ]
    hp = per_member(ppo.MemberHyperparams, members, torch.device(device))
    # Through IMPALA's max-pools one update of one epoch: which input of a window is the largest can
    # flip with a float32 rounding, and then that window's gradient goes elsewhere, so each further
    # step widens the gap (~1e-2 after 3 updates of 3 epochs; ~1e-6 after the first 2 steps).
    resnet = encoder_of(spec) == "impala"
    cfg = PPOConfig(epochs=1 if resnet else 3, minibatches=minibatches, normalize_advantage=normalize)
    anneal = torch.tensor([1.0, 0.5, 0.8, 1.0], device=device)
    for step in range(1 if resnet else 3):
        batch = ppo.Batch(*(t.to(device) for t in random_batch(spec, population, 6, 5, seed=10 + step)))
        if step > 0:  # member 3 trains once, then has no data anywhere: inactive, with momentum
            batch.valid[3] = False
        active = batch.valid.flatten(1).any(1)
        norm = ppo.loss_normalizers(batch.valid.flatten(1).sum(1), minibatches, world_size=1)
        plan = [
            None if i is None else i.to(device)
            for i in minibatching.minibatch_plan(6 * 5, cfg, torch.Generator().manual_seed(step))
        ]
        stats = ppo.update(pop, pop, optimizer, batch, hp, cfg, plan, anneal, norm, active)
        update_each_member(nets, adams, batch, hp, cfg, plan, anneal, norm, active)
        assert all(np.isfinite(v) for v in stats.values())
        if step == 0:
            after_first = (pop.flat.detach()[3].clone(), optimizer.exp_avg[3].clone())
    # Behind an encoder the heads' input gradient (hand-written, batched) and the convolutions'
    # sum in another order than a member's own modules: gradients near 0 differ by float32
    # roundings, which Adam's step (lr 1e-2 for member 2) turns into ~3e-6.
    atol = (2e-6, 1e-7) if pop.image is None else (1e-5, 1e-6)
    for m, (net, adam) in enumerate(zip(nets, adams, strict=True)):
        got = pop.member_params(m)
        for name, want in net.state_dict().items():
            np.testing.assert_allclose(
                got[name], want.cpu().numpy(), rtol=2e-4, atol=atol[0], err_msg=f"member {m} {name}"
            )
        moments = torch.cat([adam.state[p]["exp_avg"].reshape(-1) for p in net.parameters()])
        # parameters() and state_dict() share an order here (no buffers)
        torch.testing.assert_close(optimizer.exp_avg[m], moments, rtol=2e-4, atol=atol[1])
        assert int(optimizer.steps[m]) == int(adam.state[next(net.parameters())]["step"])
    # Inactive, member 3 stayed exactly where its one update left it, though Adam had momentum.
    assert torch.equal(pop.flat.detach()[3], after_first[0]) and torch.equal(optimizer.exp_avg[3], after_first[1])
    assert int(optimizer.steps[3]) == cfg.epochs * minibatches  # the first update's steps only


# On the CPU one member, or rows of FUSED_ROW_MIN, take the fused kernel member by member; three
# narrow rows take the ops over [P, D].
@pytest.mark.parametrize("population,width", [(1, 40), (3, 40), (3, FUSED_ROW_MIN)])
def test_population_adam_steps_each_member_as_torch_adam(population: int, width: int) -> None:
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(population, width))
    rows = [torch.nn.Parameter(param.detach()[m].clone()) for m in range(population)]
    optimizer = PopulationAdam(param)
    adams = [torch.optim.Adam([row], lr=lr, eps=1e-5) for row, lr in zip(rows, (1e-2, 3e-3, 1e-3), strict=False)]
    lr = torch.tensor([1e-2, 3e-3, 1e-3][:population])
    for step in range(4):
        grads = torch.randn(population, width)
        param.grad = grads.clone()
        active = torch.ones(population, dtype=torch.bool)
        active[-1] = step < 2  # the last member sits the last two steps out
        optimizer.step(lr, active)
        for m, (row, adam) in enumerate(zip(rows, adams, strict=True)):
            if active[m]:
                row.grad = grads[m].clone()
                adam.step()
    for m, (row, adam) in enumerate(zip(rows, adams, strict=True)):
        torch.testing.assert_close(param.detach()[m], row.detach(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(optimizer.exp_avg_sq[m], adam.state[row]["exp_avg_sq"], rtol=1e-5, atol=1e-9)
        assert int(optimizer.steps[m]) == int(adam.state[row]["step"])
    assert int(optimizer.steps[-1]) == 2


@pytest.mark.parametrize("population", [1, 3])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_member_whose_gradient_is_not_finite_skips_its_step_and_is_counted(population: int, bad: float) -> None:
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(population, 40))
    optimizer = PopulationAdam(param)
    lr = torch.full((population,), 1e-2)
    param.grad = torch.randn(population, 40)
    optimizer.step(lr)  # momentum, so that a step on a zero gradient would still move
    before, moments = param.detach().clone(), optimizer.exp_avg.clone()
    grad = torch.randn(population, 40)
    grad[0, 7] = bad
    param.grad = grad
    optimizer.step(lr, torch.ones(population, dtype=torch.bool))
    assert torch.equal(param.detach()[0], before[0]) and torch.equal(optimizer.exp_avg[0], moments[0])
    assert int(optimizer.steps[0]) == 1 and int(optimizer.nonfinite) == 1
    assert bool(torch.isfinite(param).all()) and bool(torch.isfinite(optimizer.exp_avg_sq).all())
    if population > 1:  # the others step as usual
        assert not torch.equal(param.detach()[1:], before[1:]) and optimizer.steps[1:].tolist() == [2.0, 2.0]
    param.grad = torch.randn(population, 40)
    optimizer.step(lr, norms=torch.tensor([bad] + [1.0] * (population - 1)))  # the clipping's norms say so
    assert int(optimizer.nonfinite) == 2 and int(optimizer.steps[0]) == 1


def test_a_ppo_update_on_absurd_rewards_leaves_the_weights_finite() -> None:
    """Rewards of 3e38 are finite in float32, so the wire lets them through; their returns are not."""
    torch.manual_seed(0)
    pop = PopulationActorCritic(DISCRETE, (16, 16), 2)
    optimizer = PopulationAdam(pop.flat)
    batch = random_batch(DISCRETE, 2, 8, 4, seed=1)
    batch = batch._replace(rewards=batch.rewards.index_fill(0, torch.tensor([0]), 3e38))  # member 0 only
    cfg = PPOConfig(epochs=2)
    hp = per_member(
        ppo.MemberHyperparams,
        [{**dict.fromkeys(TUNABLE, 0.2), "learning_rate": 1e-3, "gamma": 0.99, "gae_lambda": 0.95}] * 2,
        torch.device("cpu"),
    )
    before = pop.flat.detach().clone()
    active = torch.ones(2, dtype=torch.bool)
    ppo.update(
        pop,
        pop,
        optimizer,
        batch,
        hp,
        cfg,
        minibatching.minibatch_plan(8 * 4, cfg, torch.Generator()),
        torch.ones(2),
        ppo.loss_normalizers(torch.tensor([32, 32]), cfg.minibatches, 1),
        active,
    )
    assert torch.equal(pop.flat.detach()[0], before[0]) and int(optimizer.nonfinite) == cfg.epochs
    assert not torch.equal(pop.flat.detach()[1], before[1]), "the healthy member must still learn"
    assert bool(torch.isfinite(pop.flat).all())


def test_a_pbt_copy_moves_weights_and_optimizer_state() -> None:
    torch.manual_seed(0)
    pop = PopulationActorCritic(DISCRETE, (16, 16), 3)
    optimizer = PopulationAdam(pop.flat)
    pop.flat.grad = torch.randn_like(pop.flat)
    optimizer.step(torch.full((3,), 1e-3))
    optimizer.steps[2] = 7  # a history of its own

    def state(member: int) -> list[torch.Tensor]:
        return [
            t[member].detach().clone() for t in (pop.flat, optimizer.exp_avg, optimizer.exp_avg_sq, optimizer.steps)
        ]

    assert not any(torch.equal(a, b) for a, b in zip(state(2), state(0), strict=True))
    bystander = state(1)
    copy_member(pop, optimizer, wire.Decision(id=1, target=2, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.1)))
    assert all(torch.equal(a, b) for a, b in zip(state(2), state(0), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(state(1), bystander, strict=True))
    assert all(np.array_equal(pop.member_params(2)[k], v) for k, v in pop.member_params(0).items())


def test_parameter_noise_is_seeded_by_the_decision() -> None:
    """Every rank applies a decision on its own: the noise must come out the same everywhere."""
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        pop = PopulationActorCritic(DISCRETE, (16, 16), 2)
        decision = wire.Decision(id=5, target=1, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.1), param_noise=0.02)
        copy_member(pop, PopulationAdam(pop.flat), decision)
        results.append(pop.flat.detach().clone())
    assert torch.equal(results[0], results[1])
    noise = results[0][1] - results[0][0]
    assert abs(float(noise.std()) - 0.02) < 0.003


@pytest.mark.parametrize("algo", ["sac", "td3", "dqn"])
def test_off_policy_copies_take_the_decisions_parameter_noise_on_the_policy_alone(algo: str) -> None:
    """AgileRL mutates every algorithm's weights; the off-policy ones used to drop the noise. The
    target's policy (what its actors run) is the source's plus the decision's seeded noise, the
    same on every rank; its critics and target networks are the source's, unperturbed."""
    spec = (
        EnvSpec(obs_shape=(3,), obs_dtype="float32", action_kind="continuous", action_dim=2)
        if algo != "dqn"
        else DISCRETE
    )
    run_config = RunConfig(algo=algo, population=2)
    decision = wire.Decision(
        id=9, target=1, source=0, hyperparams=dict.fromkeys(ALGORITHMS[algo].tunable, 0.1), param_noise=0.05
    )
    trainers = []
    for _ in range(2):  # two ranks, each applying the decision on its own
        torch.manual_seed(0)
        trainer = make_trainer(spec, run_config, (), 0, 1, torch.device("cpu"))
        assert isinstance(trainer, OffPolicyTrainer)
        trainer.copy_member(decision)
        trainers.append(trainer.algorithm)
    policy = trainers[0].policy_network.flat.detach()
    assert torch.equal(policy, trainers[1].policy_network.flat.detach())
    noise = policy[1] - policy[0]
    assert abs(float(noise.std()) - 0.05) < 0.01
    for name, network in vars(trainers[0]).items():  # every other network: the source's exactly
        if isinstance(network, Stacked) and network is not trainers[0].policy_network:
            assert torch.equal(network.flat[1], network.flat[0]), name
