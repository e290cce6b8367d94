"""PPO batches of random data, and the env specs the population tests run them through."""

from __future__ import annotations

import pytest
import torch

from rlmq.common.schema import EnvSpec
from rlmq.learners import ppo

DISCRETE = EnvSpec(obs_shape=(4,), action_kind="discrete", action_dim=2)
CONTINUOUS = EnvSpec(
    obs_shape=(3,), action_kind="continuous", action_dim=2, action_low=(-2.0, -2.0), action_high=(2.0, 2.0)
)
# Images ([H, W, C] bytes, and [C, H, W] floats) through MinAtar's convolution (common/images.py).
IMAGE = EnvSpec(obs_shape=(5, 5, 2), obs_dtype="uint8", action_kind="discrete", action_dim=3)
IMAGE_CONTINUOUS = EnvSpec(obs_shape=(2, 6, 5), action_kind="continuous", action_dim=2)
# Through IMPALA's ResNet: padded convolutions, max-pools and residual sums.
IMAGE_RESNET = EnvSpec(obs_shape=(6, 5, 2), obs_dtype="uint8", action_kind="discrete", action_dim=3)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CI has none)")


def random_batch(spec: EnvSpec, population: int, steps: int, slots: int, seed: int, state_size: int = 0) -> ppo.Batch:
    """Random rollouts (and, for a recurrent network of `state_size`, random first states)."""
    g = torch.Generator().manual_seed(seed)
    shape = (population, steps, slots)
    if spec.action_kind == "discrete":
        actions = torch.randint(0, spec.action_dim, shape, generator=g)
    else:
        actions = torch.randn(*shape, spec.action_dim, generator=g)
    return ppo.Batch(
        obs=torch.randn(population, steps + 1, slots, spec.obs_size, generator=g),
        actions=actions,
        behaviour_logp=-torch.rand(shape, generator=g) - 0.2,
        rewards=torch.randn(shape, generator=g),
        terminated=torch.rand(shape, generator=g) < 0.05,
        truncated=torch.rand(shape, generator=g) < 0.03,
        valid=torch.rand(shape, generator=g) < 0.95,
        core_state=torch.randn(population, 1, slots, state_size, generator=g) * 0.5,
    )
