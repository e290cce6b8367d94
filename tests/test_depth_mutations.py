"""AgileRL's layer mutation (`pbt.layer_probability`): members of different depths in one stacked
network, an absent hidden layer passing its input through. Held to lone networks of each member's
own layers, in `stacked_mlp` (forward, every gradient, gradcheck), in the learners' networks, in
training, and in the weights the actors play."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import Tensor

from rlmq.cli.status import hyperparam_words
from rlmq.common import wire
from rlmq.common.architecture import width_name
from rlmq.common.config import PBTConfig, RunConfig
from rlmq.coordinator import pbt
from rlmq.learners import stacked_mlp as stacked
from rlmq.learners.networks import ActorCritic, PopulationActorCritic
from rlmq.learners.offpolicy import OffPolicyTrainer
from rlmq.learners.shapes import layer_passes, set_member_shapes
from rlmq.learners.shapes import mask as width_mask
from rlmq.learners.stacked_mlp import Tower, stacked_mlp, stacked_towers
from rlmq.learners.trainers import make_trainer
from tests.test_shape_mutations import CONTINUOUS, DISCRETE, check_published, training

P, N, IN, H, OUT = 3, 9, 4, 6, 2
DEPTHS = (3, 2, 1)  # member m has its first DEPTHS[m] of three hidden layers


def network(dtype: torch.dtype) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    g = torch.Generator().manual_seed(0)
    sizes = [IN, H, H, H, OUT]
    weights = [torch.randn(P, o, i, generator=g, dtype=dtype) for i, o in zip(sizes[:-1], sizes[1:], strict=True)]
    biases = [torch.randn(P, o, generator=g, dtype=dtype) for o in sizes[1:]]
    x = torch.randn(P, N, IN, generator=g, dtype=dtype)
    return x.requires_grad_(), [w.requires_grad_() for w in weights], [b.requires_grad_() for b in biases]


def passes() -> tuple[Tensor | None, ...]:
    widths = torch.tensor([[H if i < d else 0 for i in range(3)] for d in DEPTHS])
    found = layer_passes(widths)
    assert found is not None and found[0] is None  # every member has its first layer
    return found


def lone(x: Tensor, weights: list[Tensor], biases: list[Tensor], member: int, activation: str) -> Tensor:
    """Member `member` as a network of its own layers only, in plain autograd ops."""
    act = {"relu": torch.relu, "tanh": torch.tanh, "elu": torch.nn.functional.elu}[activation]
    h = x[member]
    for i in range(DEPTHS[member]):
        h = act(h @ weights[i][member].T + biases[i][member])
    return h @ weights[-1][member].T + biases[-1][member]


@pytest.mark.parametrize("path", ["hand-written", "autograd"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "elu"])
def test_an_absent_layer_passes_its_input_through_as_a_network_without_it_would(
    monkeypatch: pytest.MonkeyPatch, path: str, activation: stacked.Activation
) -> None:
    monkeypatch.setattr(stacked, "HAND_WRITTEN_MIN_ROWS", 0 if path == "hand-written" else 10**9)
    if path == "autograd" and activation == "tanh":
        monkeypatch.setattr(stacked, "traced", lambda: True)  # tanh takes the hand-written path otherwise
    x, weights, biases = network(torch.float64)
    out = stacked_mlp(x, weights, biases, activation, passes=passes())
    want = torch.stack([lone(x, weights, biases, m, activation) for m in range(P)])
    torch.testing.assert_close(out, want)
    upstream = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *weights, *biases], upstream)
    expected = torch.autograd.grad(want, [x, *weights, *biases], upstream, allow_unused=True)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, torch.zeros_like(g) if e is None else e)
    for member, depth in enumerate(DEPTHS):  # the layers a member lacks get no gradient
        for layer in range(depth, 3):
            assert not got[1 + layer][member].any() and not got[1 + 4 + layer][member].any()


def test_the_hand_written_passes_gradcheck_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacked, "HAND_WRITTEN_MIN_ROWS", 0)
    x, weights, biases = network(torch.float64)
    through = passes()
    assert torch.autograd.gradcheck(
        lambda x, *p: stacked_mlp(x, p[:4], p[4:], torch.tensor([0, 1, 2]), passes=through),
        (x, *weights, *biases),
    )


def test_a_tower_passes_as_stacked_mlp_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """PPO's actor-critic runs its MLPs as `stacked_towers`: the same passes, from one flat parameter."""
    monkeypatch.setattr(stacked, "HAND_WRITTEN_MIN_ROWS", 0)
    x, weights, biases = network(torch.float64)
    linears, offset = [], 0
    for w in weights:
        linears.append((offset, w.shape[1], w.shape[2], offset + w[0].numel()))
        offset += w[0].numel() + w.shape[1]
    flat = torch.cat([t for w, b in zip(weights, biases, strict=True) for t in (w.flatten(1), b)], 1).detach()
    flat.requires_grad_()
    tower = Tower(tuple(linears), "elu", False, passes())
    (out,) = stacked_towers(x, flat, (tower,))
    torch.testing.assert_close(out, stacked_mlp(x, weights, biases, "elu", passes=passes()))
    assert torch.autograd.gradcheck(lambda x, f: stacked_towers(x, f, (tower,))[0], (x, flat))


def depth_run(algo: str = "td3", **section: object) -> RunConfig:
    pbt_section = PBTConfig(layer_probability=1.0, min_layers=1, max_layers=3)
    if algo == "ppo":
        return RunConfig(population=3, pbt=pbt_section, hidden_sizes=(16, 16))
    base = dataclasses.replace(getattr(RunConfig(), algo), hidden_sizes=(16, 16), **section)
    return RunConfig(algo=algo, population=3, pbt=pbt_section, **{algo: base})  # type: ignore[arg-type]


def with_layers(run: RunConfig, *layers: tuple[int, ...]) -> list[dict[str, float]]:
    return [
        {**run.base_hyperparams(), **{width_name(i): float(w) for i, w in enumerate((*ws, 0, 0, 0)[:3])}}
        for ws in layers
    ]


def test_a_run_that_mutates_depth_allocates_the_deepest_network_and_starts_at_the_configs() -> None:
    run = depth_run("sac")
    assert run.allocated().sac.hidden_sizes == (16, 16, 16)
    base = run.base_hyperparams()
    assert (base["width.0"], base["width.1"], base["width.2"]) == (16.0, 16.0, 0.0)
    assert hyperparam_words(run.base_hyperparams(), {}) == ["layers 16×16"]
    with pytest.raises(ValueError, match="min_layers ≤ the hidden layers ≤ pbt.max_layers"):
        dataclasses.replace(run, pbt=dataclasses.replace(run.pbt, max_layers=1))
    with pytest.raises(ValueError, match="layer_probability mutate members of method pbt"):
        RunConfig(
            algo="td3",
            population=4,
            method="cem",
            pbt=run.pbt,
            td3=dataclasses.replace(RunConfig().td3, shared_critic=True),
        )
    with pytest.raises(ValueError, match="min_layers ≤ max_layers"):
        PBTConfig(min_layers=3, max_layers=2)
    # On the wire: a member has its first layer, and none after one it lacks.
    for bad in ({"width.0": 0.0, "width.1": 16.0}, {"width.0": 16.0, "width.1": 0.0, "width.2": 8.0}):
        with pytest.raises(wire.WireError, match="none after one of width 0"):
            wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, **bad})


def test_the_layer_mutation_adds_after_the_last_or_removes_it_within_bounds() -> None:
    two = {"learning_rate": 1e-3, "width.0": 32.0, "width.1": 24.0, "width.2": 0.0, "width.3": 0.0}
    drawn = [pbt.mutate_depth(two, 1.0, 1, 4, np.random.default_rng([7, i])) for i in range(400)]
    added = [d for d in drawn if d["width.2"] > 0]
    removed = [d for d in drawn if d["width.1"] == 0]
    assert len(added) + len(removed) == 400 and 150 < len(added) < 250  # even odds: σ = 10
    assert all(d["width.2"] == 24.0 and d["width.3"] == 0.0 for d in added)  # as wide as the last
    assert pbt.mutate_depth(two, 0.0, 1, 4, np.random.default_rng(0)) == two
    # At a bound only the other way: one layer can only grow, the allocation's four only shrink.
    one = {**two, "width.1": 0.0}
    assert all(pbt.mutate_depth(one, 1.0, 1, 4, np.random.default_rng(i))["width.1"] == 32.0 for i in range(20))
    four = {**two, "width.2": 24.0, "width.3": 8.0}
    assert all(pbt.mutate_depth(four, 1.0, 1, 4, np.random.default_rng(i))["width.3"] == 0.0 for i in range(20))
    # The node mutation moves only the layers a member has.
    moved = [pbt.mutate_widths(two, (8,), 1.0, 8, 64, np.random.default_rng([2, i])) for i in range(200)]
    assert all(m["width.2"] == m["width.3"] == 0.0 for m in moved)
    assert {n for m in moved for n in ("width.0", "width.1") if m[n] != two[n]} == {"width.0", "width.1"}


def test_a_shallower_member_computes_what_a_network_of_its_own_layers_does() -> None:
    run = depth_run("ppo")
    torch.manual_seed(0)
    population = PopulationActorCritic(DISCRETE, run.allocated().hidden_sizes, 3)
    members = with_layers(run, (16, 16, 16), (16, 8), (12,))
    set_member_shapes([population], [], members)
    obs = torch.randn(3, 20, DISCRETE.obs_size)
    actions = torch.randint(0, DISCRETE.action_dim, (3, 20))
    logp, entropy, value = population(obs, actions)
    for m, sizes in enumerate(((16, 16, 16), (16, 8), (12,))):
        params = population.member_params(m)  # trimmed: what the member's actors get
        assert sum(1 for name in params if name.startswith("policy.") and name.endswith(".weight")) == len(sizes) + 1
        network = ActorCritic(DISCRETE, sizes)
        network.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
        for got, want in zip((logp[m], entropy[m], value[m]), network(obs[m], actions[m]), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_layer_added_keeps_a_relu_members_function_then_learns_and_one_removed_stays_zero() -> None:
    run = depth_run("td3", learning_starts=1, batch_size=16, buffer_size=256, replay_ratio=0.1)
    members = with_layers(run, (16, 16), (16, 16, 16), (16,))
    trainer, train = training(run, members)
    train()
    actor = trainer.algorithm.policy_network
    names = actor.linear_names("policy")
    obs = torch.randn(3, 50, CONTINUOUS.obs_size)
    before = actor.mlp(names, obs).detach()
    # Member 0 gains a third layer: the identity on ReLU outputs, so the same function at once.
    trainer.grow_member(0, (16, 16, 0), (16, 16, 16), seed=3)
    members[0]["width.2"] = 16.0
    trainer.set_hyperparams(members)
    torch.testing.assert_close(actor.mlp(names, obs).detach(), before)
    torch.testing.assert_close(actor.tensor("policy.4.weight")[0], torch.eye(16))
    # Member 1 loses its third: its weights and Adam moments there are zeroed and stay so.
    members[1]["width.2"] = 0.0
    trainer.set_hyperparams(members)
    train()
    assert not torch.equal(actor.tensor("policy.4.weight")[0], torch.eye(16))  # the new layer learns
    widths = torch.tensor([[16, 16, 16], [16, 16, 0], [16, 0, 0]])
    for network in trainer.member_networks():
        unused = ~width_mask(network.layout, widths, network.flat.shape[1])
        assert unused[1].any() and unused[2].any() and not network.flat.detach()[unused].any()
    for optimizer in trainer.algorithm.optimizers.values():
        network = next(n for n in trainer.member_networks() if n.flat is optimizer.param)
        unused = ~width_mask(network.layout, widths, network.flat.shape[1])
        assert not optimizer.exp_avg[unused].any() and not optimizer.exp_avg_sq[unused].any()


def test_shallow_weights_published_play_as_the_learner_and_load_back_into_the_allocation() -> None:
    run = depth_run("sac")
    torch.manual_seed(0)
    trainer = make_trainer(CONTINUOUS, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    trainer.set_hyperparams(with_layers(run, (16,), (16, 16), (16, 16, 16)))
    published = trainer.member_params(0)
    assert {n for n in published if n.startswith("policy.")} == {
        f"policy.{i}.{k}" for i in (0, 2) for k in ("weight", "bias")
    }
    check_published(run, trainer, published)  # the output layer back at the end, zeros between
