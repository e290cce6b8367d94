"""The actor-critic the learners train. Its state-dict names are the contract that
`rlmq.common.models.NumpyPolicy` reads on the actors: keep the two in step."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.config import EnvSpec


def mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        linear = nn.Linear(fan_in, fan_out)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy and the value; Gaussian policies learn a state-free
    log standard deviation."""

    def __init__(self, spec: EnvSpec, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.discrete = spec.action_kind == "discrete"
        self.policy = mlp([spec.obs_dim, *hidden_sizes, spec.action_dim], out_gain=0.01)
        self.value = mlp([spec.obs_dim, *hidden_sizes, 1], out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(spec.action_dim))

    def distribution(self, obs: Tensor) -> torch.distributions.Distribution:
        out = self.policy(obs)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp())

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-probability of `actions`, entropy, value) — one call, so DDP sees every grad."""
        value = self.value(obs).squeeze(-1)
        if self.discrete:  # by hand: torch.distributions' checks cost more than the maths here
            log_probs = torch.log_softmax(self.policy(obs), dim=-1)
            logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            return logp, -(log_probs.exp() * log_probs).sum(-1), value
        dist = self.distribution(obs)
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1), value


def to_numpy_params(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_params(model: nn.Module, params: dict[str, np.ndarray]) -> None:
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in params.items()}
    model.load_state_dict(state, strict=True)
