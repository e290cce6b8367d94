"""Convolutional encoders: which one a run picks, the actors' NumPy forward pass against torch's, the
exported policy against the actors', and Atari's and MinAtar's envs as rlmq builds them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlmq.cli.export import ExportedPolicy
from rlmq.common import envs
from rlmq.common.config import RunConfig
from rlmq.common.images import NumpyEncoder, encoded_size, image_layout, resolve_encoder
from rlmq.common.models import make_policy
from rlmq.common.schema import EnvSpec, obs_features
from rlmq.common.torch_images import TorchEncoder
from rlmq.learners.encoders import image_encoder, stacked_encode
from rlmq.learners.networks import ActorCritic
from tests.helpers.references import to_numpy_params

ATARI = EnvSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", action_kind="discrete", action_dim=6, frame_stack=4)
MINATAR = EnvSpec(obs_shape=(10, 10, 4), obs_dtype="bool", action_kind="discrete", action_dim=3)
FLAT = EnvSpec(obs_shape=(8,), action_kind="continuous", action_dim=2)
SMALL = EnvSpec(obs_shape=(6, 6, 2), obs_dtype="uint8", action_kind="discrete", action_dim=4)


def test_auto_picks_the_cnn_that_fits_the_images_and_none_for_vectors() -> None:
    assert resolve_encoder("auto", ATARI) == "nature" and encoded_size(ATARI, "nature") == 3136
    assert resolve_encoder("auto", MINATAR) == "minatar" and encoded_size(MINATAR, "minatar") == 1024
    assert resolve_encoder("auto", FLAT) == "mlp" and encoded_size(FLAT, "mlp") == 8
    assert resolve_encoder("auto", MINATAR, takes_images=False) == "mlp"  # SAC, TD3: flattened
    assert resolve_encoder("mlp", ATARI) == "mlp"
    # IMPALA's ResNet only when named: any size (each stage halves a side, rounding up)
    assert resolve_encoder("impala", ATARI) == "impala" and encoded_size(ATARI, "impala") == 32 * 11 * 11
    assert resolve_encoder("impala", MINATAR) == "impala" and encoded_size(MINATAR, "impala") == 32 * 2 * 2
    layout = image_layout(ATARI)
    assert layout is not None and (layout.channels, layout.channels_last, layout.scale) == (4, False, 1 / 255)
    layout = image_layout(MINATAR)
    assert layout is not None and (layout.channels, layout.channels_last, layout.scale) == (4, True, 1.0)


@pytest.mark.parametrize(
    "choice,spec,takes_images,says",
    [
        ("nature", MINATAR, True, "does not fit 10×10"),
        ("minatar", FLAT, True, "needs a 3-D Box"),
        ("minatar", MINATAR, False, "take flat observations"),  # SAC, TD3
        ("resnet", MINATAR, True, "is not one of auto, mlp, nature, minatar, impala"),
    ],
)
def test_an_encoder_that_cannot_run_is_refused_with_the_fix(
    choice: str, spec: EnvSpec, takes_images: bool, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        resolve_encoder(choice, spec, takes_images)


def test_a_run_config_refuses_an_unknown_encoder_and_probe_refuses_one_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="encoder must be one of"):
        RunConfig(encoder="cnn")
    with pytest.raises(envs.EnvError, match="MinAtar/Breakout-v1 with dqn: encoder 'nature' does not fit 10×10"):
        envs.probe("MinAtar/Breakout-v1", "dqn", "nature")


def random_observations(spec: EnvSpec, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.obs_dtype == "uint8":
        return rng.integers(0, 256, (count, *spec.obs_shape), dtype=np.uint8)
    return rng.random((count, *spec.obs_shape)) < 0.3


@pytest.mark.parametrize(
    "spec,encoder",
    [(ATARI, "nature"), (MINATAR, "minatar"), (SMALL, "minatar"), (ATARI, "impala"), (MINATAR, "impala")],
    ids=["atari-nature", "minatar", "small-channels-last-bytes", "atari-impala", "minatar-impala"],
)
def test_the_actors_numpy_encoder_equals_torchs(spec: EnvSpec, encoder: str) -> None:
    torch.manual_seed(0)
    net = ActorCritic(spec, (32,), encoder=encoder)
    obs = random_observations(spec, 7, seed=1)
    features = obs_features(obs, spec)
    with torch.no_grad():
        want = net.features(torch.from_numpy(features)).numpy()
    actors = NumpyEncoder(to_numpy_params(net), spec, encoder)
    assert want.std() > 0
    for got in (actors(features), TorchEncoder(actors)(features)):  # the actors' two runners
        assert got.shape == (7, encoded_size(spec, encoder)) and got.dtype == np.float32
        # float32 sums in another order: errors grow with the depth (15 convolutions for IMPALA's) and the scale
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_only_actors_of_the_large_encoders_import_torch(tmp_path: Path) -> None:
    """An actor's policy imports torch for the Nature CNN and IMPALA's ResNet, where torch's
    convolutions are faster, and never for MinAtar's network or a flat observation."""
    for name, spec, encoder in (("minatar", MINATAR, "minatar"), ("atari", ATARI, "nature")):
        params = to_numpy_params(ActorCritic(spec, (8,), encoder=encoder))
        np.savez(tmp_path / f"{name}.npz", **params)
    probe = f"""
import sys, numpy as np
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import EnvSpec
def policy(name, spec, encoder):
    with np.load("{tmp_path}/" + name + ".npz") as saved:
        return NumpyPolicy(dict(saved), spec, encoder=encoder)
minatar = policy("minatar", {MINATAR!r}, "minatar")
minatar.forward(np.zeros((2, 10, 10, 4), bool))
print("torch" in sys.modules, type(minatar._encode).__name__)
atari = policy("atari", {ATARI!r}, "nature")
atari.forward(np.zeros((2, 4, 84, 84), np.uint8))
print("torch" in sys.modules, type(atari._encode).__name__)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "NumpyEncoder", "True", "TorchEncoder"], out.stdout + out.stderr


@pytest.mark.parametrize(
    "spec,encoder",
    [(MINATAR, "auto"), (SMALL, "auto"), (MINATAR, "impala")],
    ids=["minatar", "small", "minatar-impala"],
)
def test_actors_and_the_exported_policy_act_as_the_learners_network(spec: EnvSpec, encoder: str) -> None:
    torch.manual_seed(2)
    run = RunConfig(env_id="x", algo="ppo", encoder=encoder)
    net = ActorCritic(spec, (32,), encoder=run.encoder_for(spec))
    with torch.no_grad():  # logits of a fresh policy are nearly equal: spread them so argmax means something
        for p in net.policy.parameters():
            p.mul_(30)
    policy = make_policy(run, to_numpy_params(net), spec)
    assert policy.encoder is not None
    obs = random_observations(spec, 64, seed=3)
    with torch.no_grad():
        logits = net.policy(net.features(torch.from_numpy(obs_features(obs, spec)))).numpy()
    np.testing.assert_allclose(policy.forward(obs), logits, rtol=1e-4, atol=1e-4)
    greedy = logits.argmax(-1)
    assert len(np.unique(greedy)) > 1
    np.testing.assert_array_equal(policy.mode(obs), greedy)
    exported = ExportedPolicy(policy).eval()
    with torch.no_grad():
        np.testing.assert_array_equal(exported(torch.from_numpy(obs)).numpy(), greedy)


def test_minatar_runs_as_it_is_bool_frames_channels_last() -> None:
    env = envs.make_vector_env("MinAtar/Breakout-v1", 2)
    spec = envs.describe(env, "MinAtar/Breakout-v1")
    obs = env.reset(seed=0)[0]
    env.close()
    assert spec == MINATAR and obs.dtype == np.bool_ and obs.shape == (2, 10, 10, 4)
    assert RunConfig(env_id="MinAtar/Breakout-v1").encoder_for(spec) == "minatar"
    assert not RunConfig(env_id="MinAtar/Breakout-v1").signs_rewards


def test_atari_is_gymnasiums_preprocessing_step_for_step() -> None:
    """The wrapper path rlmq builds for an ALE id (`rlmq eval --video`'s, and the reference the native
    env is held to in test_atari.py) against gymnasium's wrappers applied by hand: the same frames,
    rewards and ends for the same seed and actions."""
    env_id, steps = "ALE/Pong-v5", 300
    ours = envs.make_vector_env(env_id, 1, native=False)
    theirs = gym.wrappers.FrameStackObservation(
        gym.wrappers.AtariPreprocessing(
            gym.make(env_id, frameskip=1), noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
        ),
        stack_size=4,
    )
    ours_obs, _ = ours.reset(seed=5)
    their_obs, _ = theirs.reset(seed=5)
    assert envs.describe(ours, env_id) == ATARI and ours_obs.dtype == np.uint8
    np.testing.assert_array_equal(ours_obs[0], their_obs)
    actions = np.random.default_rng(0).integers(0, 6, steps)
    rewards = 0.0
    for action in actions:
        obs, reward, term, trunc, _ = ours.step(np.array([action]))
        their_obs, their_reward, their_term, their_trunc, _ = theirs.step(int(action))
        np.testing.assert_array_equal(obs[0], their_obs)
        assert (reward[0], term[0], trunc[0]) == (their_reward, their_term, their_trunc)
        rewards += abs(float(reward[0]))
        if term[0] or trunc[0]:
            break
    ours.close()
    theirs.close()
    assert rewards > 0, "no point was scored: the rewards were never compared"
    assert RunConfig(env_id=env_id).signs_rewards and not RunConfig(env_id=env_id, sign_rewards=False).signs_rewards


@pytest.mark.parametrize(
    "spec,encoder",
    [
        (SMALL, "minatar"),
        (EnvSpec(obs_shape=(2, 40, 36), action_kind="discrete", action_dim=2), "nature"),
        (SMALL, "impala"),
    ],
    ids=["minatar", "nature", "impala"],
)
def test_grouped_convolutions_equal_each_members_own(spec: EnvSpec, encoder: str) -> None:
    """The GPU's way (one grouped convolution per layer for the population) against the CPU's (each
    member's convolutions in turn) and a member's own `nn.Sequential`: outputs and gradients."""
    torch.manual_seed(4)
    image = image_encoder(spec, encoder)
    assert image is not None
    members = [ActorCritic(spec, (8,), encoder=encoder) for _ in range(3)]
    features = torch.from_numpy(obs_features(random_observations(spec, 5, seed=5), spec))[None].repeat(3, 1, 1)
    features[1] *= 0.5  # each member its own inputs
    results = []
    for grouped in (True, False):
        convs = range(len(image.conv_names))
        weights = [torch.stack([m.encoder.conv(i).weight for m in members]).detach().requires_grad_() for i in convs]
        biases = [torch.stack([m.encoder.conv(i).bias for m in members]).detach().requires_grad_() for i in convs]
        out = stacked_encode(features, weights, biases, image, grouped=grouped)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        results.append((out.detach(), [t.grad for t in weights + biases]))
    for m, member in enumerate(members):
        with torch.no_grad():
            want = member.features(features[m])
        for out, _grads in results:
            torch.testing.assert_close(out[m], want, rtol=1e-5, atol=1e-5)
    (grouped_out, grouped_grads), (own_out, own_grads) = results
    assert grouped_out.abs().sum() > 0
    for got, want in zip(grouped_grads, own_grads, strict=True):
        assert got is not None and want is not None and want.abs().sum() > 0
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_short_minatar_run_learns_above_random(tmp_path: Path) -> None:
    """PPO through `rlmq up` with MinAtar's convolution (the shipped config flattens the frames
    into an MLP, which learned faster): CNN learners, NumPy CNN actors, bool frames on the wire. A
    uniformly random policy scores 0.38 on MinAtar Breakout (14,673 episodes); the run stops once
    the last 100 episodes average 2 and the run's own evaluation of its policy does too."""
    run_dir, config = tmp_path / "run", tmp_path / "ppo-minatar-cnn.toml"
    config.write_text(
        'env_id = "MinAtar/Breakout-v1"\nalgo = "ppo"\nencoder = "minatar"\nnum_envs = 16\n'
        "rollout_length = 128\nrollouts_in_flight = 4\nhidden_sizes = [256]\n"
        "[ppo]\nlearning_rate = 5e-4\nepochs = 4\nminibatches = 8\nrollouts_per_batch = 4\n"
    )
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlmq.cli",
            "up",
            "--run-dir",
            str(run_dir),
            "--actors",
            "2",
            "--learners",
            "1",
            "--config",
            str(config),
            "--total-steps",
            "300000",
            "--target-return",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = up.stdout + up.stderr
    assert up.returncode == 0, output
    run_config = json.loads((run_dir / "summary.json").read_text())["run_config"]
    assert run_config["encoder"] == "minatar", run_config
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success"] and summary["evaluation"]["mean_return"] >= 2, summary  # the run's own verdict
