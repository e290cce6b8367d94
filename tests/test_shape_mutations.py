"""AgileRL's architecture mutations: PBT switches a member's hidden activation (`pbt.activations`)
and moves its hidden widths (`pbt.node_probability`); the learners run every member's own shape
in one update, and its actors, evaluator and `rlmq eval` play the weights as they were trained."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

from rlmq.cli.status import hyperparam_words
from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS
from rlmq.common.architecture import ACTIVATIONS, activation_code, width_name
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.models import make_policy
from rlmq.common.schema import EnvSpec
from rlmq.coordinator import pbt
from rlmq.learners import decisions
from rlmq.learners.networks import ActorCritic, PopulationActorCritic, Stacked
from rlmq.learners.offpolicy import OffPolicyTrainer
from rlmq.learners.pbt_state import PbtState
from rlmq.learners.shapes import mask as width_mask
from rlmq.learners.shapes import set_member_shapes
from rlmq.learners.trainers import make_trainer
from tests.helpers.offpolicy_rank import rollout

CONTINUOUS = EnvSpec(
    obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, 0.0), action_high=(2.0, 1.0)
)
DISCRETE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3)
MIXED = {"activation": [activation_code(a) for a in ACTIVATIONS]}  # member m plays ACTIVATIONS[m]


def hyperparams(run: RunConfig) -> list[dict[str, float]]:
    """Three members' hyperparameters, member m's activation ACTIVATIONS[m]."""
    return [{**run.base_hyperparams(), "activation": code} for code in MIXED["activation"]]


def test_the_mutation_switches_to_another_listed_activation_at_its_probability() -> None:
    choices, start = ("relu", "tanh", "elu"), {"learning_rate": 1e-3, "activation": activation_code("tanh")}
    drawn = [
        pbt.mutate_activation(start, choices, 0.3, np.random.default_rng([5, i]))["activation"] for i in range(2000)
    ]
    switched = [code for code in drawn if code != start["activation"]]
    assert abs(len(switched) / 2000 - 0.3) < 0.04  # binomial: σ ≈ 0.01
    counts = {ACTIVATIONS[int(code)]: switched.count(code) for code in set(switched)}
    assert set(counts) == {"relu", "elu"} and abs(counts["relu"] - counts["elu"]) < 0.2 * len(switched)
    never = pbt.mutate_activation(start, choices, 0.0, np.random.default_rng(1))
    assert never == start
    # A member outside the choices (the config's own activation was not listed) takes any of them.
    outside = pbt.mutate_activation(start, ("relu", "elu"), 1.0, np.random.default_rng(2))["activation"]
    assert ACTIVATIONS[int(outside)] in ("relu", "elu")


def test_a_decision_mutates_the_activation_it_copies() -> None:
    cfg = PBTConfig(selection="truncation", fraction=0.5, activations=("relu", "elu"), activation_probability=1.0)
    members = [{"learning_rate": 1e-3, "activation": activation_code(a)} for a in ("relu", "elu", "relu", "relu")]
    returns = {0: [1.0], 1: [9.0], 2: [5.0], 3: [0.0]}
    choice = pbt.decide(cfg, returns, 3, members, pbt.decision_rng(0, 4))
    assert choice is not None and choice.source in (1, 2)
    copied = members[choice.source]["activation"]
    assert choice.hyperparams["activation"] != copied  # probability 1: always the other one
    unlisted = dataclasses.replace(cfg, activations=())
    plain = pbt.decide(unlisted, returns, 3, members, pbt.decision_rng(0, 4))
    assert plain is not None and plain.hyperparams["activation"] == members[plain.source]["activation"]


def test_each_member_of_a_ppo_population_plays_its_own_activation_as_a_lone_network_would() -> None:
    torch.manual_seed(0)
    nets = [ActorCritic(DISCRETE, (16, 16), activation=a) for a in ACTIVATIONS]
    population = PopulationActorCritic(DISCRETE, (16, 16), len(nets), activation="tanh")
    for m, net in enumerate(nets):
        population.load_member(m, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    population.set_activations(torch.tensor(MIXED["activation"], dtype=torch.long))
    obs = torch.randn(len(nets), 20, DISCRETE.obs_size)
    actions = torch.randint(0, DISCRETE.action_dim, (len(nets), 20))
    logp, entropy, value = population(obs, actions)
    for m, net in enumerate(nets):
        for got, want in zip((logp[m], entropy[m], value[m]), net(obs[m], actions[m]), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    population.set_activations(None)  # back to every member's "tanh"
    _, _, tanh_value = population(obs, actions)
    torch.testing.assert_close(tanh_value[1], value[1])
    assert not torch.allclose(tanh_value[0], value[0])


@pytest.mark.parametrize("algo", ["sac", "td3", "dqn"])
def test_the_learners_and_the_actors_play_a_member_under_its_own_activation(algo: str) -> None:
    """Each member's network in the learner (its actor, critics and target networks alike) runs
    its own activation, and the NumPy policy the actors build from its weights and
    `Weights.activation` computes what the learner's does."""
    spec = DISCRETE if algo == "dqn" else CONTINUOUS
    run = RunConfig(algo=algo, population=3, pbt=PBTConfig(activations=ACTIVATIONS))
    torch.manual_seed(0)
    trainer = make_trainer(spec, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    members = hyperparams(run)
    trainer.set_hyperparams(members)
    codes = torch.tensor(MIXED["activation"], dtype=torch.long)
    networks = [n for n in vars(trainer.algorithm).values() if isinstance(n, Stacked)]
    assert len(networks) >= 2 and all(torch.equal(n.activations, codes) for n in networks)  # type: ignore[arg-type]
    policy = trainer.algorithm.policy_network
    obs = np.random.default_rng(1).standard_normal((16, spec.obs_size)).astype(np.float32)
    with torch.no_grad():
        learner = policy.mlp(policy.linear_names("policy"), torch.from_numpy(obs).expand(3, -1, -1)).numpy()
    outputs = []
    for m, activation in enumerate(ACTIVATIONS):
        weights = wire.Weights(member=m, version=1, params=trainer.member_params(m), activation=activation)
        actor = make_policy(run, dict(weights.params), spec, activation=weights.activation)
        assert actor.activation_name == activation
        outputs.append(actor.forward(obs))
        np.testing.assert_allclose(outputs[-1], learner[m], rtol=1e-4, atol=1e-5)
    # Not one activation for all: the same weights under another activation act otherwise.
    relu = make_policy(run, dict(trainer.member_params(1)), spec, activation="relu").forward(obs)
    assert not np.allclose(relu, outputs[1], atol=1e-3)


def test_a_population_step_with_mixed_activations_trains_every_member() -> None:
    td3 = dataclasses.replace(
        RunConfig().td3, hidden_sizes=(16, 16), learning_starts=1, batch_size=16, buffer_size=256, replay_ratio=0.1
    )
    run = RunConfig(algo="td3", population=3, pbt=PBTConfig(activations=ACTIVATIONS), td3=td3)
    torch.manual_seed(0)
    trainer = make_trainer(CONTINUOUS, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    trainer.set_hyperparams(hyperparams(run))
    before = trainer.algorithm.policy_network.flat.detach().clone()
    rng = np.random.default_rng(0)
    rollouts = [[rollout(rng, CONTINUOUS, m) for _ in range(4)] for m in range(3)]
    _, trained = trainer.train(rollouts, [sum(r.num_steps for r in rs) for rs in rollouts], 4)
    after = trainer.algorithm.policy_network.flat.detach()
    assert trained == [0, 1, 2] and torch.isfinite(after).all()
    assert all(not torch.equal(after[m], before[m]) for m in range(3))


@pytest.mark.parametrize(
    ("pbt_section", "words"),
    [
        ({"activations": ("relu",)}, "two or more"),
        ({"activations": ("relu", "swish")}, "two or more"),
        ({"activations": ("relu", "tanh"), "activation_probability": 1.5}, "activation_probability"),
    ],
)
def test_bad_activation_settings_are_refused_naming_the_fix(pbt_section: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        PBTConfig(**pbt_section)  # type: ignore[arg-type]


def test_activation_mutations_need_pbt_members_with_their_own_networks_and_an_eager_update() -> None:
    listed = PBTConfig(activations=("relu", "tanh"))
    shared = dataclasses.replace(RunConfig().td3, shared_critic=True, diversity_weight=0.1)
    with pytest.raises(ValueError, match="method pbt"):
        RunConfig(algo="td3", population=4, method="dvd", pbt=listed, td3=shared)
    with pytest.raises(ValueError, match="compile_update"):
        RunConfig(population=4, pbt=listed, compile_update="default")
    assert RunConfig(population=4, pbt=listed).base_hyperparams()["activation"] == activation_code("tanh")  # PPO's
    assert "activation" not in RunConfig(population=1, pbt=listed).base_hyperparams()
    assert set(RunConfig(algo="dqn", population=2, pbt=listed).base_hyperparams()) == {
        *ALGORITHMS["dqn"].tunable,
        "activation",
    }


def test_the_wire_carries_an_activation_and_refuses_one_it_does_not_know() -> None:
    params = {"policy.0.weight": np.zeros((2, 3), np.float32)}
    weights = wire.Weights(member=0, version=1, params=params, activation="elu")
    assert wire.decode(wire.encode(weights)).activation == "elu"
    with pytest.raises(wire.WireError, match="activation"):
        wire.Weights(member=0, version=1, params=params, activation="gelu")
    decision = wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, "activation": 2.0})
    assert wire.decode(wire.encode(decision)) == decision
    with pytest.raises(wire.WireError, match="activation"):
        wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, "activation": 0.5})
    with pytest.raises(wire.WireError, match="activation"):
        wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, "activation": 3.0})


def test_status_names_a_members_activation() -> None:
    ranges = {"learning_rate": HyperRange(1e-4, 1e-2, log=True)}
    member = {"learning_rate": 1.2e-3, "gamma": 0.99, "activation": activation_code("elu")}
    assert hyperparam_words(member, ranges) == ["lr 1.2e-03", "activation elu"]
    assert hyperparam_words({"learning_rate": 1.2e-3}, ranges) == ["lr 1.2e-03"]  # no mutation: not shown


WIDE = 32  # every member's allocation


def training(run: RunConfig, members: list[dict[str, float]]) -> tuple[OffPolicyTrainer, Callable[[], None]]:
    """A trainer of `members`' shapes, and one step of it on fresh random rollouts of each member."""
    torch.manual_seed(0)
    trainer = make_trainer(CONTINUOUS, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    trainer.set_hyperparams(members)
    rng = np.random.default_rng(0)

    def train() -> None:
        rollouts = [[rollout(rng, CONTINUOUS, m) for _ in range(4)] for m in range(len(members))]
        trainer.train(rollouts, [sum(r.num_steps for r in rs) for rs in rollouts], 4)

    return trainer, train


def widths_run(algo: str = "td3", **section: object) -> RunConfig:
    pbt_section = PBTConfig(node_probability=1.0, node_steps=(8,), min_width=8, max_width=WIDE)
    if algo == "ppo":
        return RunConfig(population=3, pbt=pbt_section, hidden_sizes=(16, 16))
    base = dataclasses.replace(getattr(RunConfig(), algo), hidden_sizes=(16, 16), **section)
    return RunConfig(algo=algo, population=3, pbt=pbt_section, **{algo: base})  # type: ignore[arg-type]


def with_widths(run: RunConfig, *widths: tuple[int, int]) -> list[dict[str, float]]:
    return [{**run.base_hyperparams(), width_name(0): float(w0), width_name(1): float(w1)} for w0, w1 in widths]


def test_the_node_mutation_moves_one_layer_by_a_step_within_bounds() -> None:
    start = {"learning_rate": 1e-3, "width.0": 64.0, "width.1": 32.0}
    moved = [pbt.mutate_widths(start, (16, 32), 1.0, 16, 80, np.random.default_rng([3, i])) for i in range(400)]
    layers = ("width.0", "width.1")
    assert all(sum(after[n] != start[n] for n in layers) == 1 for after in moved)  # one layer each
    changes = {(n, after[n] - start[n]) for after in moved for n in layers if after[n] != start[n]}
    # ±16 or ±32 within [16, 80]: width.0 + 32 stops at 80 (+16), width.1 − 32 at 16 (−16)
    assert changes == {("width.0", 16.0), ("width.0", -16.0), ("width.0", -32.0)} | {
        ("width.1", 16.0),
        ("width.1", 32.0),
        ("width.1", -16.0),
    }
    assert pbt.mutate_widths(start, (16,), 0.0, 16, 80, np.random.default_rng(0)) == start
    unshaped = {"learning_rate": 1e-3}  # PBT mutates no widths: nothing to move
    assert pbt.mutate_widths(unshaped, (16,), 1.0, 16, 80, np.random.default_rng(0)) == unshaped


def test_a_member_of_narrower_widths_computes_what_a_network_of_its_own_widths_does() -> None:
    run = widths_run("ppo")
    torch.manual_seed(0)
    population = PopulationActorCritic(DISCRETE, run.allocated().hidden_sizes, 3)
    assert population.layout["policy.0.weight"][1] == (WIDE, DISCRETE.obs_size)
    members = with_widths(run, (8, 24), (32, 32), (16, 8))
    set_member_shapes([population], [], members)
    obs = torch.randn(3, 20, DISCRETE.obs_size)
    actions = torch.randint(0, DISCRETE.action_dim, (3, 20))
    logp, entropy, value = population(obs, actions)
    for m, hp in enumerate(members):
        params = population.member_params(m)  # trimmed: what the member's actors get
        lone = ActorCritic(DISCRETE, (int(hp["width.0"]), int(hp["width.1"])))
        lone.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
        for got, want in zip((logp[m], entropy[m], value[m]), lone(obs[m], actions[m]), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_leaves_a_narrower_members_unused_units_at_zero_and_a_grown_one_learning() -> None:
    """No mask in the update: a unit with zero weights in and out gets exactly zero gradients and
    Adam steps. Growth starts the new units' incoming weights and keeps the function; their
    outgoing weights then learn."""
    run = widths_run("td3", learning_starts=1, batch_size=16, buffer_size=256, replay_ratio=0.1)
    members = with_widths(run, (8, 24), (32, 32), (16, 8))
    trainer, train = training(run, members)
    train()
    actor = trainer.algorithm.policy_network
    assert actor.tensor("policy.0.weight")[1, 24:].abs().sum() > 0  # member 1 uses all 32 units
    members[1].update({"width.0": 24.0, "width.1": 16.0})  # then shrinks: its moments there must go too
    trainer.set_hyperparams(members)
    train()
    networks = trainer.member_networks()
    assert len(networks) == 4  # actor, critic and their targets
    widths = torch.tensor([[8, 24], [24, 16], [16, 8]])
    for network in networks:
        unused = ~width_mask(network.layout, widths, network.flat.shape[1])
        assert unused.any() and not network.flat.detach()[unused].any()
    for optimizer in trainer.algorithm.optimizers.values():  # Adam's moments too: their steps stay 0
        network = next(n for n in networks if n.flat is optimizer.param)
        unused = ~width_mask(network.layout, widths, network.flat.shape[1])
        assert not optimizer.exp_avg[unused].any() and not optimizer.exp_avg_sq[unused].any()

    # Member 2's first layer grows 16 → 24: the same function at once, then its new units learn.
    obs = torch.randn(3, 50, CONTINUOUS.obs_size)
    before = actor.mlp(actor.linear_names("policy"), obs).detach()
    trainer.grow_member(2, (16, 8), (24, 8), seed=5)
    members[2]["width.0"] = 24.0
    trainer.set_hyperparams(members)
    torch.testing.assert_close(actor.mlp(actor.linear_names("policy"), obs).detach(), before)
    incoming = actor.tensor("policy.0.weight")[2, 16:24]
    outgoing = actor.tensor("policy.2.weight")[2, :8, 16:24]
    assert incoming.abs().sum() > 0 and not outgoing.any()
    train()
    assert actor.tensor("policy.2.weight")[2, :8, 16:24].abs().sum() > 0


def test_an_explore_that_changes_a_members_shape_replaces_its_policy_and_one_that_does_not_keeps_it() -> None:
    """The learner's rule (decisions.py): another activation or width is another policy even with
    the member's own weights, so its version moves on and its queued data goes; a new learning rate
    alone is the same policy."""
    run = widths_run("td3")
    run = dataclasses.replace(run, pbt=dataclasses.replace(run.pbt, activations=ACTIVATIONS))
    trainer = make_trainer(CONTINUOUS, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    members = with_widths(run, (16, 16), (16, 16), (16, 16))
    trainer.set_hyperparams(members)
    state = PbtState([dict(h) for h in members])
    actor = trainer.algorithm.policy_network
    kept = actor.flat.detach().clone()

    rate = {**members[1], "learning_rate": 2 * members[1]["learning_rate"]}
    assert decisions.apply(wire.Decision(id=1, target=1, source=1, hyperparams=rate), state, trainer) == (
        decisions.Applied()
    )
    tanh = {**rate, "activation": activation_code("tanh")}
    applied = decisions.apply(wire.Decision(id=2, target=1, source=1, hyperparams=tanh), state, trainer)
    assert applied == decisions.Applied((1,), drops_queued=True)
    assert actor.activations.tolist() == [activation_code("relu"), activation_code("tanh"), activation_code("relu")]
    wider = {**tanh, "width.1": 24.0}
    applied = decisions.apply(wire.Decision(id=3, target=1, source=1, hyperparams=wider), state, trainer)
    assert applied == decisions.Applied((1,), drops_queued=True)
    assert trainer.member_params(1)["policy.2.weight"].shape == (24, 16)
    # the member's own weights throughout (grown by zero-outgoing units); the others' untouched
    torch.testing.assert_close(actor.flat.detach()[[0, 2]], kept[[0, 2]])
    assert state.hyperparams[1] == wider and state.applied == 3


def test_weights_published_trimmed_play_as_the_learner_and_load_back_into_the_allocation() -> None:
    run = widths_run("sac")
    torch.manual_seed(0)
    trainer = make_trainer(CONTINUOUS, run, (), 0, 1, torch.device("cpu"))
    assert isinstance(trainer, OffPolicyTrainer)
    trainer.set_hyperparams(with_widths(run, (8, 24), (32, 32), (16, 8)))
    published = trainer.member_params(0)
    assert published["policy.0.weight"].shape == (8, CONTINUOUS.obs_size)
    assert published["policy.2.weight"].shape == (24, 8) and published["policy.4.weight"].shape[1] == 24
    check_published(run, trainer, published)
    lone = make_trainer(CONTINUOUS, dataclasses.replace(run, population=1), (), 0, 1, torch.device("cpu"))
    with pytest.raises(ValueError, match="policy.0.weight"):
        lone.load_member(0, published)  # not allocated wider: a narrower weight is an error


def check_published(run: RunConfig, trainer: OffPolicyTrainer, published: dict[str, np.ndarray]) -> None:
    """Member 0's published weights play in the actors' NumPy policy as the learner's network does,
    and a restarted world reads them back into its allocation, zeros beyond, as they were."""
    obs = np.random.default_rng(1).standard_normal((16, CONTINUOUS.obs_size)).astype(np.float32)
    actor = trainer.algorithm.policy_network
    with torch.no_grad():
        learner = actor.mlp(actor.linear_names("policy"), torch.from_numpy(obs).expand(3, -1, -1)).numpy()
    np.testing.assert_allclose(make_policy(run, published, CONTINUOUS).forward(obs), learner[0], rtol=1e-4, atol=1e-5)
    restarted = make_trainer(
        CONTINUOUS, run, (wire.Weights(member=0, version=3, params=published),), 0, 1, torch.device("cpu")
    )
    assert isinstance(restarted, OffPolicyTrainer)
    torch.testing.assert_close(restarted.algorithm.policy_network.flat[0], actor.flat[0])


def test_width_mutations_are_checked_against_the_hidden_sizes() -> None:
    run = widths_run("td3")
    assert run.base_hyperparams()["width.0"] == 16.0 and run.allocated().td3.hidden_sizes == (WIDE, WIDE)
    assert RunConfig(population=3).allocated() == RunConfig(population=3)
    with pytest.raises(ValueError, match="max_width"):
        RunConfig(population=3, pbt=PBTConfig(node_probability=0.5, max_width=32), hidden_sizes=(64, 64))
    with pytest.raises(ValueError, match="node_steps"):
        PBTConfig(node_probability=0.5, min_width=64, max_width=32)
    decision = wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, "width.0": 24.0})
    assert wire.decode(wire.encode(decision)) == decision
    with pytest.raises(wire.WireError, match="width.0"):
        wire.Decision(id=1, target=0, source=1, hyperparams={"learning_rate": 1e-3, "width.0": 2.5})
