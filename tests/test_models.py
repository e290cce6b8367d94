"""The actors' NumPy policy must be the learners' torch policy, read from its state dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlmq.common.algorithms import PPOConfig
from rlmq.common.config import RunConfig
from rlmq.common.models import NumpyPolicy, make_policy, sample_categorical
from rlmq.common.schema import EnvSpec
from rlmq.learners.networks import ActorCritic, fast_tanh
from rlmq.learners.stacked_mlp import Activation
from tests.helpers.references import to_numpy_params

SPECS = {
    "discrete": EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2),
    "continuous": EnvSpec(
        obs_shape=(3,),
        action_kind="continuous",
        action_dim=2,
        action_low=(-2.0, -1.0),
        action_high=(2.0, 1.0),
    ),
}


def trained_looking_model(
    spec: EnvSpec, hidden_sizes: tuple[int, ...], seed: int, activation: Activation = "tanh"
) -> ActorCritic:
    """A network whose outputs are far from the near-zero ones of a fresh init (out_gain 0.01),
    so that a wrong layer order, a missing bias or a missing activation shows."""
    torch.manual_seed(seed)
    model = ActorCritic(spec, hidden_sizes, activation=activation)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.8 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu"])
@pytest.mark.parametrize("hidden_sizes", [(64, 64), (16,), (8, 12, 6)])
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_numpy_forward_equals_torch_policy(kind: str, hidden_sizes: tuple[int, ...], activation: Activation) -> None:
    spec = SPECS[kind]
    model = trained_looking_model(spec, hidden_sizes, seed=1, activation=activation)
    # The actors' policy as a run's config makes it (PPO's `activation`).
    policy = make_policy(RunConfig(ppo=PPOConfig(activation=activation)), to_numpy_params(model), spec, 0)
    obs = np.random.default_rng(2).standard_normal((32, spec.obs_size)).astype(np.float32)
    with torch.no_grad():
        expected = model.policy(torch.from_numpy(obs)).numpy()
    got = policy.forward(obs)
    assert got.shape == (32, spec.action_dim)
    assert np.abs(expected).max() > 0.5  # outputs worth comparing
    # float32 sums in another order, whose rounding varies with the CPU's kernels: the error scales
    # with the outputs (ReLU's reach ~100 here).
    np.testing.assert_allclose(got, expected, atol=1e-6 * np.abs(expected).max(), rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_act_log_probs_equal_torch(kind: str) -> None:
    spec = SPECS[kind]
    model = trained_looking_model(spec, (64, 64), seed=3)
    policy = NumpyPolicy(to_numpy_params(model), spec)
    rng = np.random.default_rng(4)
    obs = rng.standard_normal((256, spec.obs_size)).astype(np.float32)
    actions, logp = policy.act(obs, rng)
    assert logp.dtype == np.float32 and logp.shape == (256,)
    if spec.action_kind == "discrete":
        assert actions.dtype == np.int64 and actions.shape == (256,)
        assert set(np.unique(actions)) == {0, 1}
    else:
        assert actions.shape == (256, spec.action_dim)
        assert not np.allclose(actions, policy.forward(obs))  # sampled, not the mean
    with torch.no_grad():
        expected, _entropy, _value = model(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_allclose(logp, expected.numpy(), atol=1e-4, rtol=0)
    assert logp.std() > 0.1  # log-probabilities that differ between samples


def test_numpy_policy_refuses_a_network_for_another_env() -> None:
    params = to_numpy_params(trained_looking_model(SPECS["discrete"], (8,), seed=0))
    with pytest.raises(ValueError, match="does not fit width 5"):
        NumpyPolicy(params, EnvSpec(obs_shape=(5,), action_kind="discrete", action_dim=2))
    with pytest.raises(ValueError, match="action space"):
        NumpyPolicy(params, EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=3))
    with pytest.raises(ValueError, match="no policy"):
        NumpyPolicy({"value.0.weight": params["value.0.weight"]}, SPECS["discrete"])


@pytest.mark.parametrize(
    "logits",
    [[0.0, 0.0], [2.0, -1.0, 0.5], [-3.0, 1.0, 1.0, 0.0, -0.5], [50.0, 49.0, 10.0]],
    ids=["uniform", "three", "five", "large"],
)
def test_sample_categorical_frequencies_match_softmax(logits: list[float]) -> None:
    draws = 20_000
    logits_np = np.tile(np.array(logits, np.float32), (draws, 1))
    actions, logp = sample_categorical(logits_np, np.random.default_rng(5))
    probs = np.exp(np.array(logits) - max(logits))
    probs /= probs.sum()
    frequencies = np.bincount(actions, minlength=len(logits)) / draws
    np.testing.assert_allclose(frequencies, probs, atol=0.02, rtol=0)
    np.testing.assert_allclose(logp, np.log(probs)[actions], atol=1e-5, rtol=0)


def test_fast_tanh_is_tanh_forward_and_backward() -> None:
    """The learners' tanh (NumPy's on CPU) against torch.tanh, values and gradients, across the
    range where tanh saturates."""
    x = torch.linspace(-12, 12, 2001, dtype=torch.float32)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    upstream = torch.randn(2001, generator=torch.Generator().manual_seed(0))
    fast_tanh(ours).backward(upstream)
    torch.tanh(theirs).backward(upstream)
    assert torch.allclose(fast_tanh(x), torch.tanh(x), atol=2e-7, rtol=0)
    assert ours.grad is not None and theirs.grad is not None
    assert torch.allclose(ours.grad, theirs.grad, atol=1e-6, rtol=0)
