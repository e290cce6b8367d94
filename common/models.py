"""The policy network as actors run it: a NumPy forward pass over the learner's parameters.

Learners train `rlmq.learners.networks.ActorCritic` (torch); its state-dict names are the contract
read here: ``policy.{2i}.weight`` / ``policy.{2i}.bias`` for the i-th Linear of an MLP (tanh, ReLU or ELU),
``log_std`` for continuous actions, and ``encoder.*`` for the convolutions in front of an image
policy (run by `rlmq.common.images.NumpyEncoder`, or by torch for the large encoders:
`images.TORCH_IN_ACTORS`), and ``core.*`` for a recurrent core between the two
(`rlmq.common.recurrent.NumpyCore`: the caller keeps each env slot's state). NumPy keeps torch
out of actor processes (64 actors would otherwise import it 64 times) and, at these sizes, is
cheaper per call than torch (benchmarks/LOG.md §1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlmq.common.config import RunConfig
from rlmq.common.images import TORCH_IN_ACTORS, NumpyEncoder, encoder_layer_names
from rlmq.common.recurrent import CORE_WEIGHTS, NumpyCore
from rlmq.common.schema import OBS_NORM_KEYS, EnvSpec, obs_features, obs_normalizer
from rlmq.common.wire import Params

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def policy_layer_names(params: Params) -> list[tuple[str, str]]:
    layers = []
    i = 0
    while f"policy.{i}.weight" in params:
        layers.append((f"policy.{i}.weight", f"policy.{i}.bias"))
        i += 2  # Linear, Tanh, Linear, ...: Linears sit at even indices of nn.Sequential
    return layers


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"tanh": np.tanh, "relu": _relu, "elu": _elu}


class NumpyPolicy:
    """Samples actions and their log-probabilities from an MLP policy (PPO's: tanh, ReLU or ELU)."""

    def __init__(
        self,
        params: Params,
        spec: EnvSpec,
        outputs: int | None = None,
        activation: str = "tanh",
        encoder: str = "mlp",
        torch_encoder: bool | None = None,
        device: str | None = None,
    ) -> None:
        self.activation_name, self.activation = activation, ACTIVATIONS[activation]
        names = policy_layer_names(params)
        if not names:
            raise ValueError("weights hold no policy.* layers")
        # Transposed and contiguous once here, so that each call is x @ W + b.
        self.layers = [
            (np.ascontiguousarray(params[w].T, dtype=np.float32), params[b].astype(np.float32)) for w, b in names
        ]
        self.spec = spec
        self.norm = obs_normalizer(params, spec.obs_size)
        # The convolutional encoder in front of the layers (`encoder`: RunConfig.encoder_for).
        self.encoder = None if encoder == "mlp" else NumpyEncoder(params, spec, encoder)
        if self.encoder is None and encoder_layer_names(params):
            raise ValueError('weights hold encoder.* convolutions, and the run\'s encoder is "mlp"')
        # What runs it: torch for the large encoders (`torch_encoder` None), imported only here.
        self._encode: Callable[[np.ndarray], np.ndarray] | None = self.encoder
        if self.encoder is not None and (encoder in TORCH_IN_ACTORS if torch_encoder is None else torch_encoder):
            from rlmq.common.torch_images import TorchEncoder

            self._encode = TorchEncoder(self.encoder)
        # Each layer takes what the one before gives.
        width = spec.obs_size if self.encoder is None else self.encoder.size
        self.core = NumpyCore(params, width) if any(name in params for name in CORE_WEIGHTS) else None
        width = width if self.core is None else self.core.size
        for weight, bias in self.layers:
            if weight.ndim != 2 or weight.shape[0] != width or bias.shape != (weight.shape[1],):
                raise ValueError(f"policy layer {weight.shape} / {bias.shape} does not fit width {width}")
            width = weight.shape[1]
        if width != (outputs or spec.action_dim):
            raise ValueError(f"policy gives {width} outputs, the action space needs {outputs or spec.action_dim}")
        # An image policy given a torch `device` (a GPU: `acting_device`) runs its whole forward there;
        # a recurrent one only its encoder, the slots' states staying in NumPy with the core.
        self._on_device: Callable[[np.ndarray], np.ndarray] | None = None
        if device is not None and self.encoder is not None and not spec.obs_parts:
            from rlmq.common.torch_images import DeviceForward

            layers = [] if self.core is not None else self.layers
            self._on_device = DeviceForward(self.encoder, layers, activation, self.norm, device)
        self.discrete = spec.action_kind == "discrete"
        # The deterministic action `mode` (and `rlmq export`) takes from the network's output.
        self.head = "argmax" if self.discrete else "mean"
        self.scale, self.bias = scale_and_bias(spec)
        # PPO's Gaussian keeps a state-free log-std; a policy with its own outputs (SAC) does not.
        self._log_std = None if self.discrete or outputs else params["log_std"].astype(np.float32)
        self.noise_color = 0.0  # β of the exploration noise's 1/f^β spectrum: 0 white
        if self._log_std is not None and self._log_std.shape != (spec.action_dim,):
            raise ValueError(f"log_std {self._log_std.shape} does not fit {spec.action_dim} actions")

    @property
    def state_size(self) -> int:
        """Floats of an env slot's core state: 0 for a policy without memory."""
        return 0 if self.core is None else self.core.state_size

    def forward(self, obs: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """The network's output for observations [N, *obs_shape] as the env gives them. A recurrent
        policy (`state_size` > 0) needs each slot's `state` [N, state_size], advanced in place."""
        if self._on_device is not None and self.core is None:
            return self._on_device(obs)
        if self._on_device is not None:
            x = self._on_device(obs)
        else:
            x = obs_features(obs, self.spec)
            if self.norm is not None:
                x = self.norm(x)
            if self._encode is not None:
                x = self._encode(x)
        if self.core is not None:
            if state is None:
                raise ValueError("a recurrent policy steps from each env slot's state: pass it")
            x = self.core(x, state)
        for weight, bias in self.layers[:-1]:
            x = self.activation(x @ weight + bias)
        weight, bias = self.layers[-1]
        out: np.ndarray = x @ weight + bias
        return out

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        noise: np.ndarray | None = None,
        state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(actions, log-probabilities) for a batch of observations (and the slots' core `state`,
        advanced, for a recurrent policy). A continuous policy's standard-normal draws
        [N, action_dim] come from `rng`, or are `noise` where the caller keeps colored noise for the
        policy's `noise_color` (common/noise.py)."""
        out = self.forward(obs, state)
        if self.discrete:
            return sample_categorical(out, rng)
        assert self._log_std is not None
        if noise is None:
            noise = rng.standard_normal(out.shape, dtype=np.float32)
        actions = out + np.exp(self._log_std) * noise
        logp = -(0.5 * noise * noise + self._log_std + _HALF_LOG_2PI).sum(axis=-1)
        return actions, logp.astype(np.float32)

    def mode(self, obs: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
        """The deterministic action (evaluation, export), as `head` says: the likeliest one, the
        Gaussian's mean clipped to the env's bounds (as SB3's predict), or tanh of the mean (SAC)
        or of the output (TD3) mapped onto the bounds; a recurrent policy's `state` advanced."""
        out = self.forward(obs, state)
        if self.head == "argmax":
            return np.argmax(out, axis=-1)
        if self.head == "mean":
            return np.clip(out, self.bias - self.scale, self.bias + self.scale) if self.spec.action_low else out
        if self.head == "squashed_mean":
            out = np.split(out, 2, axis=-1)[0]
        return (np.tanh(out) * self.scale + self.bias).astype(np.float32)


def scale_and_bias(spec: EnvSpec) -> tuple[np.ndarray, np.ndarray]:
    """How [-1, 1] maps onto the env's action bounds (unbounded: onto [-1, 1] itself)."""
    low = np.asarray(spec.action_low or (-1.0,) * spec.action_dim, np.float32)
    high = np.asarray(spec.action_high or (1.0,) * spec.action_dim, np.float32)
    return (high - low) / 2, (high + low) / 2


class SquashedGaussianPolicy(NumpyPolicy):
    """SAC's policy: a ReLU MLP giving mean and log-std; actions tanh-squashed into the env's
    bounds. Must match learners/sac.py (`Actor`, LOG_STD_MIN/MAX)."""

    def __init__(self, params: Params, spec: EnvSpec, noise_color: float = 0.0, activation: str = "relu") -> None:
        if spec.action_kind != "continuous":
            raise ValueError("SAC needs continuous actions")
        super().__init__(params, spec, outputs=2 * spec.action_dim, activation=activation)
        self.head = "squashed_mean"
        self._log_std = None
        self.noise_color = noise_color

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        noise: np.ndarray | None = None,
        state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        mean, log_std = np.split(self.forward(obs), 2, axis=-1)
        if noise is None:
            noise = rng.standard_normal(mean.shape, dtype=np.float32)
        action = np.tanh(mean + np.exp(np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)) * noise)
        # Off-policy learners do not use the behaviour log-probability.
        return (action * self.scale + self.bias).astype(np.float32), np.zeros(len(obs), np.float32)


LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class DeterministicPolicy(NumpyPolicy):
    """TD3's policy: a ReLU MLP with a tanh output in [-1, 1] (learners/td3.py, `Actor`), scaled to
    the env's bounds, plus Gaussian noise of std `noise` × half the range, clipped to the bounds.
    During `warmup` (before the member trains) actions are uniform within the bounds instead."""

    def __init__(
        self,
        params: Params,
        spec: EnvSpec,
        noise: float,
        warmup: bool,
        noise_color: float = 0.0,
        activation: str = "relu",
    ) -> None:
        if spec.action_kind != "continuous":
            raise ValueError("TD3 needs continuous actions")
        super().__init__(params, spec, outputs=spec.action_dim, activation=activation)
        self.head = "tanh"
        self.noise, self.warmup, self.noise_color = noise, warmup, noise_color

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        noise: np.ndarray | None = None,
        state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        shape = (len(obs), len(self.scale))
        if self.warmup:
            action = rng.uniform(-1.0, 1.0, shape)
        else:  # clipped here, not only at env.step: the learner must see the action that was taken
            draws = rng.standard_normal(shape) if noise is None else noise
            action = np.clip(np.tanh(self.forward(obs)) + self.noise * draws, -1.0, 1.0)
        return (action * self.scale + self.bias).astype(np.float32), np.zeros(len(obs), np.float32)


class EpsilonGreedyPolicy(NumpyPolicy):
    """DQN's policy: the argmax of a ReLU Q network (learners/dqn.py, `QNetwork`, whose Linears are
    `policy.{2i}`), or with probability `epsilon` a uniformly random action."""

    def __init__(
        self,
        params: Params,
        spec: EnvSpec,
        epsilon: float,
        encoder: str = "mlp",
        device: str | None = None,
        activation: str = "relu",
    ) -> None:
        if spec.action_kind != "discrete":
            raise ValueError("DQN needs discrete actions")
        super().__init__(params, spec, activation=activation, encoder=encoder, device=device)
        self.epsilon, self.actions = epsilon, spec.action_dim

    def act(
        self,
        obs: np.ndarray,
        rng: np.random.Generator,
        noise: np.ndarray | None = None,
        state: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        greedy = np.argmax(self.forward(obs, state), axis=-1)
        explore = rng.random(len(obs)) < self.epsilon
        action = np.where(explore, rng.integers(0, self.actions, len(obs)), greedy)
        return action.astype(np.int64), np.zeros(len(obs), np.float32)


def linear_epsilon(trained_steps: int, horizon: float, initial: float, final: float) -> float:
    """ε of a linear schedule (SB3's): `initial` at 0 env steps to `final` at `horizon`, then flat."""
    progress = 1.0 if horizon <= 0 else min(trained_steps / horizon, 1.0)
    return initial + progress * (final - initial)


def _td3_policy(
    run_config: RunConfig, params: Params, spec: EnvSpec, trained_steps: int, device: str | None
) -> NumpyPolicy:
    td3 = run_config.td3
    warmup = trained_steps < td3.learning_starts
    return DeterministicPolicy(params, spec, td3.exploration_noise, warmup, td3.noise_color, td3.activation)


def _dqn_policy(
    run_config: RunConfig, params: Params, spec: EnvSpec, trained_steps: int, device: str | None
) -> NumpyPolicy:
    dqn = run_config.dqn
    horizon = dqn.exploration_fraction * run_config.total_steps / run_config.population  # per member
    epsilon = linear_epsilon(trained_steps, horizon, dqn.exploration_initial_eps, dqn.exploration_final_eps)
    return EpsilonGreedyPolicy(params, spec, epsilon, run_config.encoder_for(spec), device, dqn.activation)


# Each algorithm's actor policy (algorithms.ALGORITHMS): (run config, weights, env spec, the env steps
# the weights were trained on, on which exploration schedules depend, the device an image policy
# acts on) → policy.
POLICIES: dict[str, Callable[[RunConfig, Params, EnvSpec, int, str | None], NumpyPolicy]] = {
    "ppo": lambda run_config, params, spec, trained_steps, device: NumpyPolicy(
        params, spec, activation=run_config.ppo.activation, encoder=run_config.encoder_for(spec), device=device
    ),
    "sac": lambda run_config, params, spec, trained_steps, device: SquashedGaussianPolicy(
        params, spec, run_config.sac.noise_color, run_config.sac.activation
    ),
    "td3": _td3_policy,
    "dqn": _dqn_policy,
}


def make_policy(
    run_config: RunConfig,
    params: Params,
    spec: EnvSpec,
    trained_steps: int = 0,
    device: str | None = None,
    activation: str = "",
) -> NumpyPolicy:
    """The actors' policy for the run's algorithm, for weights trained on `trained_steps` env steps,
    acting on `device` (`acting_device`'s), with the hidden `activation` PBT gave the member (""
    the run config's: `wire.Weights.activation`); raises KeyError/ValueError for weights that do
    not fit, the recurrent core and observation statistics included: a run that normalizes
    observations publishes them with every member's weights, and no other does."""
    if activation and activation != run_config.algo_config.activation:
        run_config = run_config.with_activation(activation)
    if (OBS_NORM_KEYS[0] in params) != run_config.normalize_obs:
        raise ValueError(
            f"weights {'without' if run_config.normalize_obs else 'with'} observation statistics "
            f"in a run with normalize_obs = {str(run_config.normalize_obs).lower()}"
        )
    policy = POLICIES[run_config.algo](run_config, params, spec, trained_steps, device)
    core = "identity" if policy.core is None else policy.core.kind
    if (core, policy.state_size) != (run_config.core, run_config.core_state_size):
        raise ValueError(
            f"weights with core {core} ({policy.state_size} state floats) in a run with core = "
            f"{run_config.core!r}, core_size = {run_config.core_size}"
        )
    return policy


def acting_device(requested: str, encoder: str, index: int = 0) -> str | None:
    """The GPU an actor runs its policy on (`ActorConfig.device`: auto, cpu, cuda or cuda:N), or
    None for the CPU path (NumPy, with torch for the large encoders' convolutions). Only the large
    encoders (`images.TORCH_IN_ACTORS`) act on a GPU: "auto" puts them there when torch sees one
    (actor `index` on GPU index mod count); any other policy stays in NumPy without importing
    torch. ValueError, naming the fix, for a GPU asked for that is not there."""
    if requested == "cpu" or encoder not in TORCH_IN_ACTORS:
        return None
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return f"cuda:{index % count}" if count else None
    wanted = int(requested.partition(":")[2] or index % max(count, 1))
    if wanted >= count:
        raise ValueError(
            f"actors' device {requested}: torch sees {count} GPU(s) here; use auto (a GPU where "
            "there is one, else the CPU) or cpu (rlmq up --actor-device, rlmq actor --device)"
        )
    return f"cuda:{wanted}"


def sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Gumbel-max sampling; returns int64 actions and float32 log-probabilities."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    gumbel = -np.log(-np.log(rng.random(logits.shape, dtype=np.float32) + 1e-20) + 1e-20)
    actions = np.argmax(log_probs + gumbel, axis=-1)
    logp = np.take_along_axis(log_probs, actions[:, None], axis=-1)[:, 0]
    return actions.astype(np.int64), logp.astype(np.float32)
