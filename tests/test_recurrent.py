"""Recurrent policies through the whole path: the actors step the core with a state per slot and
ship each rollout's first state; the learner recomputes the core over the rollout from it and gets
the actor's numbers at every step; the population's recurrent update equals the loop over members;
a stateless policy's rollouts carry no state at all."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from ppo_batches import CONTINUOUS, DISCRETE, random_batch

import rlmq
from rlmq.actors.collector import Collector
from rlmq.cli.evaluate import load_checkpoint, policy_of
from rlmq.cli.export import export
from rlmq.common import envs, wire
from rlmq.common.algorithms import ALGORITHMS, DQNConfig, PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.models import NumpyPolicy, make_policy
from rlmq.common.recurrent import CORE_WEIGHTS, STATE_PARTS
from rlmq.common.schema import EnvSpec, core_state_problem
from rlmq.learners import cores, minibatching, ppo
from rlmq.learners.networks import ActorCritic, Memory, PopulationActorCritic
from rlmq.learners.optim import PopulationAdam, per_member
from rlmq.learners.pbt_state import PbtState
from rlmq.learners.policy_file import MemberPolicy, PolicyRecord
from tests.helpers.references import to_numpy_params, update_each_member

TUNABLE = ALGORITHMS["ppo"].tunable
CORE_SIZE = 8
CPU = torch.device("cpu")


def collect(kind: str, rollouts: int, steps: int = 16, slots: int = 4) -> tuple[list[wire.Rollout], ActorCritic]:
    """`rollouts` consecutive rollouts of CartPole without velocities under one recurrent policy:
    episodes of a random-ish policy last 10–40 steps, so slots start episodes within and across
    rollouts."""
    env = envs.make_vector_env("CartPoleNoVel-v1", slots)
    spec = envs.describe(env, "CartPoleNoVel-v1")
    torch.manual_seed(1)
    net = ActorCritic(spec, (16,), core=kind, core_size=CORE_SIZE)
    policy = NumpyPolicy(to_numpy_params(net), spec)
    collector = Collector(env, spec, steps, seed=5)
    try:
        return [collector.collect(policy, 0, 1, "a") for _ in range(rollouts)], net
    finally:
        collector.close()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_learner_recomputes_the_actors_core_at_every_step_across_episodes_and_rollouts(kind: str) -> None:
    """Same weights: the learner's log-probabilities of the actions taken, recomputed from each
    rollout's shipped state with episode-start resets, equal the actor's at every step; the state
    the learner reaches at a rollout's end (reset where the next starts) is the next one's shipped
    state."""
    rollouts, net = collect(kind, 4)
    spec = envs.probe("CartPoleNoVel-v1")
    valid = np.stack([r.valid for r in rollouts])
    assert (~valid).sum() >= 4, "episodes must end inside the rollouts"
    assert (~valid[1:, 0]).any() or (~valid[:-1, -1]).any(), "and an episode must start at a rollout boundary"
    pop = PopulationActorCritic(spec, (16,), 1, core=kind, core_size=CORE_SIZE)
    pop.load_member(0, to_numpy_params(net))
    for first, after in zip(rollouts, [*rollouts[1:], None], strict=True):
        batch = ppo.join_rollouts([[first]], spec, 16, 4, CPU, STATE_PARTS[kind] * CORE_SIZE)
        memory = batch.memory()
        with torch.no_grad():
            logp, _ = pop.logp_and_values(batch.obs.flatten(1, 2), batch.actions.flatten(1, 2), memory)
        np.testing.assert_allclose(logp.view(16, 4).numpy(), first.logprobs, rtol=1e-5, atol=1e-5)
        if after is None:
            continue
        weights = {name.split(".")[1]: pop.tensor(name).detach() for name in CORE_WEIGHTS}
        _, last = cores.unroll(kind, batch.obs[:, :-1], memory.state, memory.starts[:, :-1], weights)
        last = last * (~memory.starts[:, -1]).unsqueeze(-1)  # the next rollout's first step resets
        assert after.core_state is not None
        np.testing.assert_allclose(last[0].detach().numpy(), after.core_state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "spec,kind,minibatches,bptt_steps",
    [
        (DISCRETE, "lstm", 2, 0),
        (CONTINUOUS, "lstm", 1, 0),
        (DISCRETE, "gru", 1, 0),
        (CONTINUOUS, "gru", 2, 0),
        (DISCRETE, "lstm", 3, 3),
        (CONTINUOUS, "gru", 1, 2),
    ],
)
def test_the_vectorized_recurrent_update_equals_the_loop_over_members(
    spec: EnvSpec, kind: str, minibatches: int, bptt_steps: int
) -> None:
    """Three members with different learning rates, discounts and clip ranges, random first states
    and episode starts: after updates of minibatches of whole slots, or of chunks of `bptt_steps`
    from the states the core reaches there, each member's weights and Adam moments equal those of
    its own ActorCritic (torch's own cell stepped one step at a time) with torch.optim.Adam and
    clip_grad_norm_."""
    population, steps, slots = 3, 6, 4
    torch.manual_seed(3)
    pop = PopulationActorCritic(spec, (16,), population, core=kind, core_size=CORE_SIZE)
    nets = []
    for m in range(population):
        net = ActorCritic(spec, (16,), core=kind, core_size=CORE_SIZE)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in pop.member_params(m).items()})
        nets.append(net)
    adams = [torch.optim.Adam(net.parameters(), lr=1.0, eps=1e-5) for net in nets]
    optimizer = PopulationAdam(pop.flat)
    members = [
        {**dict.fromkeys(TUNABLE, 0.1), "learning_rate": lr, "clip_coef": 0.1 + 0.05 * m, "gamma": 0.9 + 0.03 * m}
        for m, lr in enumerate((1e-3, 3e-3, 1e-2))
    ]
    hp = per_member(ppo.MemberHyperparams, members, CPU)
    cfg = PPOConfig(epochs=2, minibatches=minibatches, bptt_steps=bptt_steps)
    anneal = torch.tensor([1.0, 0.5, 0.8])
    for step in range(2):
        batch = random_batch(spec, population, steps, slots, seed=10 + step, state_size=STATE_PARTS[kind] * CORE_SIZE)
        active = batch.valid.flatten(1).any(1)
        norm = ppo.loss_normalizers(batch.valid.flatten(1).sum(1), minibatches, world_size=1)
        plan = minibatching.minibatch_plan(
            minibatching.plan_size(cfg, batch.valid, True), cfg, torch.Generator().manual_seed(step)
        )
        stats = ppo.update(pop, pop, optimizer, batch, hp, cfg, plan, anneal, norm, active)
        update_each_member(nets, adams, batch, hp, cfg, plan, anneal, norm, active)
        assert all(np.isfinite(v) for v in stats.values())
    for m, (net, adam) in enumerate(zip(nets, adams, strict=True)):
        got = pop.member_params(m)
        assert got["core.weight_hh"].std() > 0
        for name, want in net.state_dict().items():
            np.testing.assert_allclose(got[name], want.numpy(), rtol=2e-4, atol=2e-6, err_msg=f"member {m} {name}")
        moments = torch.cat([adam.state[p]["exp_avg"].reshape(-1) for p in net.parameters()])
        torch.testing.assert_close(optimizer.exp_avg[m], moments, rtol=2e-4, atol=1e-7)


def test_a_stateless_policys_rollouts_carry_no_state_and_a_recurrent_ones_travel_checked() -> None:
    """Without a core the encoded rollout holds no core_state field (a stateless run's rollouts are the bytes
    they were before cores); with one it round-trips, and a malformed one is refused on decode
    and by the learner's check against the run's layout."""
    (stateless,), _ = collect("identity", 1)
    assert stateless.core_state is None
    assert "core_state" not in msgpack.unpackb(wire.encode(stateless))[2]
    assert core_state_problem(stateless.core_state, 0, 4) is None
    assert core_state_problem(stateless.core_state, 16, 4) is not None  # a recurrent run needs it
    (recurrent,), _ = collect("lstm", 1)
    assert recurrent.core_state is not None and recurrent.core_state.shape == (4, 2 * CORE_SIZE)
    decoded = wire.decode(wire.encode(recurrent))
    assert isinstance(decoded, wire.Rollout) and decoded.core_state is not None
    np.testing.assert_array_equal(decoded.core_state, recurrent.core_state)
    assert core_state_problem(decoded.core_state, 2 * CORE_SIZE, 4) is None
    assert core_state_problem(decoded.core_state, 2 * CORE_SIZE + 1, 4) is not None
    assert core_state_problem(decoded.core_state, 0, 4) is not None  # a stateless run refuses one
    fields = msgpack.unpackb(wire.encode(recurrent))
    for bad, reason in [
        (np.zeros((3, 16), np.float32), "bad_shape"),  # not one row per slot
        (np.zeros((4, 16), np.float64), "bad_dtype"),
        (np.full((4, 16), np.nan, np.float32), "non_finite"),
    ]:
        fields[2]["core_state"] = wire.pack(bad)
        with pytest.raises(wire.WireError) as refused:
            wire.decode(msgpack.packb(fields))
        assert refused.value.reason == reason


def test_a_recurrent_run_is_checked_where_it_is_configured() -> None:
    """A core for an algorithm without one, one that would be compiled, or minibatches that cannot
    be whole slots: each refused with the fix named; weights whose core is not the run's too."""
    with pytest.raises(ValueError, match="sac has no recurrent policy"):
        RunConfig(algo="sac", env_id="Pendulum-v1", core="lstm")
    with pytest.raises(ValueError, match='compile_update = "off"'):
        RunConfig(core="gru", compile_update="default")
    with pytest.raises(ValueError, match="ppo.minibatches must be at most"):
        RunConfig(core="lstm", num_envs=2, ppo=PPOConfig(minibatches=4))
    with pytest.raises(ValueError, match="core must be one of"):
        RunConfig(core="transformer")
    with pytest.raises(ValueError, match="ppo.bptt_steps must divide rollout_length"):
        RunConfig(core="lstm", rollout_length=32, ppo=PPOConfig(bptt_steps=5))
    with pytest.raises(ValueError, match="dqn.burn_in must be shorter"):
        RunConfig(algo="dqn", core="lstm", rollout_length=8, dqn=DQNConfig(burn_in=8))
    with pytest.raises(ValueError, match="share_replay = false"):
        RunConfig(algo="dqn", core="gru", population=2, dqn=DQNConfig(share_replay=True))
    spec = envs.probe("CartPoleNoVel-v1")
    params = to_numpy_params(ActorCritic(spec, (16,), core="lstm", core_size=CORE_SIZE))
    run = RunConfig(env_id="CartPoleNoVel-v1", hidden_sizes=(16,), core="lstm", core_size=CORE_SIZE)
    assert make_policy(run, params, spec).state_size == 2 * CORE_SIZE
    for other in (RunConfig(env_id="CartPoleNoVel-v1", hidden_sizes=(16,)), RunConfig(core="gru", core_size=CORE_SIZE)):
        with pytest.raises(ValueError, match="weights with core lstm"):
            make_policy(other, params, spec)


@pytest.mark.parametrize("spec,kind", [(DISCRETE, "lstm"), (CONTINUOUS, "gru")])
def test_eval_export_and_load_policy_reproduce_the_learners_actions_step_by_step(
    tmp_path: Path, spec: EnvSpec, kind: str
) -> None:
    """Three slots over twelve steps, episodes starting inside: the learner's network unrolled over
    the whole sequence gives the deterministic actions that `rlmq eval`'s policy, the exported
    TorchScript file and `rlmq.load_policy` give one step at a time from each slot's state."""
    steps, slots = 12, 3
    torch.manual_seed(4)
    net = ActorCritic(spec, (16,), core=kind, core_size=CORE_SIZE)
    with torch.no_grad():  # heads large enough that the actions vary
        net.policy[-1].weight.mul_(100.0)
    obs = torch.randn(steps, slots, spec.obs_size) * 2
    starts = torch.zeros(steps, slots, dtype=torch.bool)
    starts[[4, 7, 9], [0, 1, 0]] = True
    size = STATE_PARTS[kind] * CORE_SIZE
    with torch.no_grad():
        out = net.policy(net.trunk(obs.flatten(0, 1), Memory(torch.zeros(slots, size), starts))).view(steps, slots, -1)
    if spec.action_kind == "discrete":
        expected = out.argmax(-1).numpy()
        assert len(set(expected.ravel().tolist())) > 1
    else:
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        expected = torch.maximum(torch.minimum(out, high), low).numpy()
    run = RunConfig(hidden_sizes=(16,), core=kind, core_size=CORE_SIZE, env_id="CartPole-v1")
    record = PolicyRecord({0: MemberPolicy(to_numpy_params(net), 1, 0)}, 0, spec, run)
    torch.save(record.to_state(), tmp_path / "checkpoint.pt")
    point = load_checkpoint(tmp_path)
    numpy_policy, loaded = policy_of(point), rlmq.load_policy(tmp_path)
    exported = torch.jit.load(str(export(point, tmp_path / "policy.pt")))
    states = {name: np.zeros((slots, size), np.float32) for name in ("eval", "load_policy")}
    exported_state = torch.zeros(slots, size)
    for t in range(steps):
        for state in states.values():
            state[starts[t].numpy()] = 0.0
        exported_state[starts[t]] = 0.0
        got = {
            "eval": numpy_policy.mode(obs[t].numpy(), states["eval"]),
            "load_policy": loaded(obs[t].numpy(), states["load_policy"]),
        }
        action, exported_state = exported(obs[t], exported_state)
        got["export"] = action.numpy()
        for name, actions in got.items():
            np.testing.assert_allclose(actions, expected[t], rtol=1e-4, atol=1e-5, err_msg=f"{name} at step {t}")
    with pytest.raises(ValueError, match="takes each slot's state"):
        loaded(obs[0].numpy())


def test_a_pbt_copy_starts_the_targets_actors_from_zero_states() -> None:
    """The learner marks a copied member's weights with the decision (kept in its checkpoint's PBT
    state); a collector handed weights of a new lineage starts every slot from zeros, while weights
    of the same lineage carry the slots' states on."""
    state = PbtState([dict.fromkeys(TUNABLE, 0.1) for _ in range(2)])
    state.apply(wire.Decision(id=1, target=1, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.2)))
    state.apply(wire.Decision(id=2, target=0, source=0, hyperparams=dict.fromkeys(TUNABLE, 0.3)))  # no copy
    assert state.copied_by == [0, 1] and PbtState.from_json(state.to_json()).copied_by == [0, 1]
    env = envs.make_vector_env("CartPoleNoVel-v1", 4)
    spec = envs.describe(env, "CartPoleNoVel-v1")
    policy = NumpyPolicy(to_numpy_params(ActorCritic(spec, (16,), core="gru", core_size=CORE_SIZE)), spec)
    collector = Collector(env, spec, 8, seed=0)
    try:
        collector.collect(policy, 1, 1, "a")
        carried = collector.collect(policy, 1, 2, "a")
        copied = collector.collect(policy, 1, 3, "a", lineage=1)
    finally:
        collector.close()
    assert carried.core_state is not None and np.abs(carried.core_state).sum() > 0
    assert copied.core_state is not None and not copied.core_state.any()
