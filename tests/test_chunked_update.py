"""An off-policy update cut into chunks (`max_steps_per_update`): the steps a chunk leaves are owed
and taken in the next iterations, before any new data, so the trainer ends where the whole update
ends, bit for bit, and the world agrees (a stop, a checkpoint, a decision) between chunks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from states import assert_same

from rlmq.common.algorithms import DQNConfig, SACConfig, TD3Config
from rlmq.common.config import RunConfig
from rlmq.common.schema import EnvSpec, allocate
from rlmq.common.wire import Rollout
from rlmq.learners import checkpoint
from rlmq.learners.trainers import Trainer, make_trainer

CPU = torch.device("cpu")
STEPS, SLOTS, POPULATION = 6, 3, 2
DISCRETE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
CONTINUOUS = EnvSpec(
    obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0)
)
SMALL = {"hidden_sizes": (8,), "batch_size": 4, "learning_starts": 1, "replay_ratio": 1.0}
CONFIGS = {
    "dqn": (DISCRETE, "dqn", DQNConfig(**SMALL, n_step=2)),
    "sac": (CONTINUOUS, "sac", SACConfig(**SMALL)),
    "td3-shared": (CONTINUOUS, "td3", TD3Config(**SMALL, shared_critic=True)),
}


def trainer_for(name: str, max_steps_per_update: int) -> tuple[Trainer, EnvSpec]:
    spec, algo, section = CONFIGS[name]
    run_config = RunConfig(
        algo=algo,
        num_envs=SLOTS,
        rollout_length=STEPS,
        population=POPULATION,
        normalize_obs=True,
        **{algo: dataclasses.replace(section, max_steps_per_update=max_steps_per_update)},  # type: ignore[arg-type]
    )
    torch.manual_seed(0)  # the same initial networks
    trainer = make_trainer(spec, run_config, (), 0, 1, CPU)
    trainer.set_hyperparams([run_config.base_hyperparams()] * POPULATION)
    return trainer, spec


def rollouts(spec: EnvSpec, seed: int) -> list[list[Rollout]]:
    rng = np.random.default_rng(seed)
    batch = []
    for member in range(POPULATION):
        arrays = allocate(spec, STEPS, SLOTS, zeros=True)
        arrays["obs"][:] = rng.standard_normal(arrays["obs"].shape)
        if spec.action_kind == "discrete":
            arrays["actions"][:] = rng.integers(0, spec.action_dim, arrays["actions"].shape)
        else:
            arrays["actions"][:] = rng.uniform(-1, 1, arrays["actions"].shape)
        arrays["rewards"][:] = rng.standard_normal(arrays["rewards"].shape)
        arrays["terminated"][:] = rng.random(arrays["terminated"].shape) < 0.1
        arrays["valid"][:] = True
        batch.append([Rollout(member=member, policy_version=0, actor="actor-0", sequence=seed, **arrays)])
    return batch


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_chunked_update_owes_what_it_leaves_and_ends_where_the_whole_one_does(name: str) -> None:
    whole, spec = trainer_for(name, max_steps_per_update=0)
    chunked, _ = trainer_for(name, max_steps_per_update=5)
    samples = [STEPS * SLOTS] * POPULATION  # 18 env steps a member: 18 gradient steps due at ratio 1
    nothing: list[list[Rollout]] = [[] for _ in range(POPULATION)]
    for seed in range(2):
        whole.train(rollouts(spec, seed), samples, 1)
        assert not whole.owes_steps()
        _, trained = chunked.train(rollouts(spec, seed), samples, 1)
        chunks = 1
        while chunked.owes_steps():  # what the learner does next: no new data until these are taken
            _, trained = chunked.train(nothing, [0] * POPULATION, 0)
            assert trained == [0, 1], "a chunk of steps changes the members' policies"
            chunks += 1
        assert chunks == 4  # 5 + 5 + 5 + 3
    assert_same(checkpoint.capture(chunked), checkpoint.capture(whole))
