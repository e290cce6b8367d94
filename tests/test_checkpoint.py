"""Learner checkpoints: every algorithm's trainer saved and restored carries on exactly as the one
that never stopped; files are written atomically, pruned to the newest K, and never unpickled."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from states import assert_same

from rlmq.common.algorithms import DQNConfig, PPOConfig, SACConfig, TD3Config
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
CONFIGS = {
    "ppo": (DISCRETE, {"ppo": PPOConfig(epochs=2, minibatches=2, normalize_reward=True)}),
    "dqn": (
        DISCRETE,
        {
            "dqn": DQNConfig(
                hidden_sizes=(8,),
                batch_size=4,
                learning_starts=1,
                replay_ratio=1.0,
                target_update_interval=2,
                n_step=2,
                lr_decay_steps=10,
            )
        },
    ),
    "sac": (CONTINUOUS, {"sac": SACConfig(hidden_sizes=(8,), batch_size=4, learning_starts=1, replay_ratio=1.0)}),
    "sac-shared": (
        CONTINUOUS,
        {"sac": SACConfig(hidden_sizes=(8,), batch_size=4, learning_starts=1, replay_ratio=1.0, shared_critic=True)},
    ),
    "td3": (CONTINUOUS, {"td3": TD3Config(hidden_sizes=(8,), batch_size=4, learning_starts=1, replay_ratio=1.0)}),
    "td3-shared": (
        CONTINUOUS,
        {"td3": TD3Config(hidden_sizes=(8,), batch_size=4, learning_starts=1, replay_ratio=1.0, shared_critic=True)},
    ),
    # Recurrent: PPO's core, and R2D2's sequence replay with its stored states.
    "ppo-lstm": (DISCRETE, {"ppo": PPOConfig(epochs=2, minibatches=2), "core": "lstm", "core_size": 8}),
    "dqn-gru": (
        DISCRETE,
        {
            "dqn": DQNConfig(hidden_sizes=(8,), batch_size=4, learning_starts=1, n_step=2, burn_in=2),
            "core": "gru",
            "core_size": 8,
        },
    ),
}


def rollout(spec: EnvSpec, rng: np.random.Generator, member: int, sequence: int, state_size: int = 0) -> Rollout:
    arrays = allocate(spec, STEPS, SLOTS, zeros=True)
    arrays["obs"][:] = rng.standard_normal(arrays["obs"].shape) * 3 + 1
    if spec.action_kind == "discrete":
        arrays["actions"][:] = rng.integers(0, spec.action_dim, arrays["actions"].shape)
    else:
        arrays["actions"][:] = rng.uniform(-1, 1, arrays["actions"].shape)
    arrays["logprobs"][:] = -rng.random(arrays["logprobs"].shape)
    arrays["rewards"][:] = rng.standard_normal(arrays["rewards"].shape)
    arrays["terminated"][:] = rng.random(arrays["terminated"].shape) < 0.1
    arrays["truncated"][:] = rng.random(arrays["truncated"].shape) < 0.05
    arrays["valid"][:] = True
    state = rng.standard_normal((SLOTS, state_size)).astype(np.float32) if state_size else None
    return Rollout(member=member, policy_version=0, actor="actor-0", sequence=sequence, core_state=state, **arrays)


def trainer_for(algo: str) -> tuple[Trainer, RunConfig, EnvSpec]:
    spec, sections = CONFIGS[algo]
    run_config = RunConfig(
        algo=algo.split("-")[0],
        num_envs=SLOTS,
        rollout_length=STEPS,
        population=POPULATION,
        normalize_obs=True,
        hidden_sizes=(8,),
        **sections,
    )
    trainer = make_trainer(spec, run_config, (), 0, 1, CPU)
    trainer.set_hyperparams([run_config.base_hyperparams()] * POPULATION)
    return trainer, run_config, spec


def train(trainer: Trainer, spec: EnvSpec, rng: np.random.Generator, sequence: int, state_size: int = 0) -> None:
    rollouts = [[rollout(spec, rng, m, sequence, state_size)] for m in range(POPULATION)]
    trainer.train(rollouts, [STEPS * SLOTS] * POPULATION, 1)


@pytest.mark.parametrize("algo", sorted(CONFIGS))
def test_a_restored_trainer_carries_on_exactly_as_the_one_that_never_stopped(algo: str, tmp_path: Path) -> None:
    """Weights, every optimizer's moments, normalization statistics, the replay and the random
    streams: after a save and a restore into a fresh trainer, the next update is bit for bit the
    one the original makes."""
    original, run_config, spec = trainer_for(algo)
    rng, size = np.random.default_rng(0), run_config.core_state_size
    for sequence in range(3):
        train(original, spec, rng, sequence, size)
    saved = checkpoint.capture(original)
    files = checkpoint.Checkpoints(tmp_path, rank=0, kept=2)
    assert files.write(1, {"trainer": saved})
    resumed, _, _ = trainer_for(algo)
    fresh = checkpoint.capture(resumed)
    checkpoint.restore(resumed, files.load(1)["trainer"], "trainer")
    assert_same(checkpoint.capture(resumed), saved)
    with pytest.raises(AssertionError):  # the fresh trainer differed: the restore is what made them equal
        assert_same(fresh, saved)
    # Sequence 0: the actors' slots start anew, since a checkpoint leaves out the running return of
    # each actor slot that PPO's reward scale follows (learners/normalization.py, RewardScaler).
    following = np.random.default_rng(1), np.random.default_rng(1)
    train(original, spec, following[0], 0, size)
    train(resumed, spec, following[1], 0, size)
    assert_same(checkpoint.capture(resumed), checkpoint.capture(original))
    for member in range(POPULATION):
        published, again = original.member_params(member), resumed.member_params(member)
        assert all(np.array_equal(published[k], again[k]) for k in published)


def test_a_checkpoint_of_another_config_is_refused_naming_the_field(tmp_path: Path) -> None:
    small, _, _ = trainer_for("sac")
    spec, _ = CONFIGS["sac"]
    wider = make_trainer(
        spec,
        RunConfig(
            algo="sac",
            num_envs=SLOTS,
            rollout_length=STEPS,
            population=POPULATION,
            normalize_obs=True,
            sac=SACConfig(hidden_sizes=(16,)),
        ),
        (),
        0,
        1,
        CPU,
    )
    with pytest.raises(
        ValueError,
        match=r"trainer\.algorithm\.actor\.flat: the checkpoint holds float32\[2, \d+\], "
        r"this run float32\[2, \d+\]",
    ):
        checkpoint.restore(wider, checkpoint.capture(small), "trainer")


class Payload:
    """Anything pickle can rebuild: what a malicious checkpoint would carry."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("unpickled",))


def test_checkpoints_load_without_pickle_and_are_written_atomically_and_pruned(tmp_path: Path) -> None:
    files = checkpoint.Checkpoints(tmp_path, rank=1, kept=2)
    for n in range(1, 5):
        assert files.write(n, {"trainer": {"x": torch.full((2,), float(n))}})
    files.prune(3)  # 4 is newer than what every rank holds: kept whatever its number
    assert checkpoint.numbers(tmp_path / "rank1") == [2, 3, 4] and files.latest() == 4
    assert float(files.load(3)["trainer"]["x"][0]) == 3.0
    torch.save({"format": checkpoint.FORMAT, "trainer": Payload()}, files.path(5))
    with pytest.raises(Exception, match="Weights only load failed"):  # torch's UnpicklingError
        files.load(5)
    (files.dir / ".00000006.tmp").write_bytes(b"half a file")  # a write a crash cut short
    assert files.latest() == 5  # a half-written file is never a checkpoint
    files.path(7).mkdir()
    (files.path(7) / "in the way").touch()  # the rename onto checkpoint 7 fails
    assert not files.write(7, {"trainer": {"x": torch.zeros(2)}})
    assert not (files.dir / ".00000007.tmp").exists()  # nothing half-written is left behind
    shutil.rmtree(files.path(7))
    files = checkpoint.Checkpoints(tmp_path, rank=1, kept=2)
    assert not list(files.dir.glob(".*.tmp"))
    assert checkpoint.latest_file(tmp_path) is None  # rank 0 wrote nothing


def test_a_disk_that_refuses_checkpoints_says_where_and_why_and_leaves_no_half_file(tmp_path: Path) -> None:
    """A checkpoint directory that cannot be made, and a write that fails (here: the directory
    replaced by a file, as root may write where permissions say no): `DiskRefused` at the start, and
    `refused` naming the path after a failed write, with no temporary file left."""
    (tmp_path / "blocked").write_text("a file where the checkpoints should go")
    with pytest.raises(checkpoint.DiskRefused, match="cannot write checkpoints to .*blocked/rank0"):
        checkpoint.Checkpoints(tmp_path / "blocked", rank=0, kept=3)
    files = checkpoint.Checkpoints(tmp_path / "ok", rank=0, kept=3)
    assert files.write(1, {"w": torch.zeros(3)}) and files.refused == ""
    shutil.rmtree(files.dir)
    files.dir.write_text("")  # every write under it fails now
    assert not files.write(2, {"w": torch.zeros(3)})
    assert (
        files.refused.startswith(f"cannot write checkpoint {files.dir / '00000002.pt'}: ")
        and "MiB free" in files.refused
    ), files.refused
