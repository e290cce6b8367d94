"""AgileRL's activation mutation: PBT switches a member's hidden activation (`pbt.activations`),
the learners run each member's own in one update, and its actors, evaluator and `rlmq eval` play
the weights under the activation they were trained with."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlmq.cli.status import hyperparam_words
from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS
from rlmq.common.architecture import ACTIVATIONS, activation_code
from rlmq.common.config import HyperRange, PBTConfig, RunConfig
from rlmq.common.models import make_policy
from rlmq.common.schema import EnvSpec
from rlmq.coordinator import pbt
from rlmq.learners.networks import ActorCritic, PopulationActorCritic, Stacked, member_activations
from rlmq.learners.offpolicy import OffPolicyTrainer
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
    codes = member_activations(members)
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
