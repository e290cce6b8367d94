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
from rlmq.common.schema import EnvSpec
from rlmq.common.wire import Rollout
from rlmq.learners import checkpoint
from rlmq.learners.trainers import Trainer, make_trainer
from tests.helpers.offpolicy_rank import POPULATION, SLOTS, SPECS, STEPS, rollout

CPU = torch.device("cpu")
SMALL = {"hidden_sizes": (8,), "batch_size": 4, "learning_starts": 1, "replay_ratio": 1.0}
CONFIGS = {  # the rollouts of tests/helpers/offpolicy_rank.py: 8 steps × 4 slots a member
    "dqn": (SPECS["dqn"], "dqn", DQNConfig(**SMALL, n_step=2)),
    "sac": (SPECS["td3"], "sac", SACConfig(**SMALL)),
    "td3-shared": (SPECS["td3"], "td3", TD3Config(**SMALL, shared_critic=True)),
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


def batch(spec: EnvSpec, seed: int) -> list[list[Rollout]]:
    rng = np.random.default_rng(seed)
    return [[rollout(rng, spec, member)] for member in range(POPULATION)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_chunked_update_owes_what_it_leaves_and_ends_where_the_whole_one_does(name: str) -> None:
    whole, spec = trainer_for(name, max_steps_per_update=0)
    chunked, _ = trainer_for(name, max_steps_per_update=5)
    nothing: list[list[Rollout]] = [[] for _ in range(POPULATION)]
    for seed in range(2):
        samples = [sum(r.num_steps for r in rollouts) for rollouts in batch(spec, seed)]
        whole.train(batch(spec, seed), samples, 1)
        assert not whole.owes_steps()
        chunked.train(batch(spec, seed), samples, 1)
        chunks = 1
        while chunked.owes_steps():  # what the learner does next: no new data until these are taken
            _, trained = chunked.train(nothing, [0] * POPULATION, 0)
            assert trained == list(range(POPULATION)), "a chunk of steps changes the members' policies"
            chunks += 1
        assert chunks == 7, chunks  # 32 env steps a member, one gradient step each: 6 chunks of 5, then 2
    assert_same(checkpoint.capture(chunked), checkpoint.capture(whole))
