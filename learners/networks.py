"""The actor-critic the learners train. Its state-dict names are the contract that
`rlmq.common.models.NumpyPolicy` reads on the actors: keep the two in step."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.images import encoded_size
from rlmq.common.recurrent import CORE_WEIGHTS
from rlmq.common.schema import EnvSpec
from rlmq.learners import cores
from rlmq.learners.encoders import ConvEncoder, ImageEncoder, encode, image_encoder, stacked_encode
from rlmq.learners.shapes import grow as grow_units
from rlmq.learners.shapes import layer_passes, padded, trimmed
from rlmq.learners.shapes import mask as width_mask
from rlmq.learners.stacked_mlp import Activation, Activations, Passes, Tower, fast_tanh, stacked_mlp, stacked_towers


class Tanh(nn.Module):
    """nn.Tanh through `fast_tanh`: the single-agent network pays what the population's does."""

    def forward(self, x: Tensor) -> Tensor:
        return fast_tanh(x)


def mlp(sizes: list[int], out_gain: float, activation: Activation = "tanh") -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        linear = nn.Linear(fan_in, fan_out)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append({"tanh": Tanh(), "relu": nn.ReLU(), "elu": nn.ELU()}[activation])
    return nn.Sequential(*layers)


class Memory(NamedTuple):
    """What a recurrent core steps from over rows of observations laid out time-major (row r of
    slot n at r · N + n, as a rollout's): each slot's state at the first row [..., N, S], and where
    its episodes start [..., R, N] (`cores.episode_starts`)."""

    state: Tensor
    starts: Tensor


def recurrent_cell(kind: str, width: int, size: int) -> nn.LSTMCell | nn.GRUCell:
    """An LSTM or GRU cell on `width` inputs, initialised as CleanRL's `ppo_atari_lstm`: orthogonal
    weights, zero biases."""
    cell = nn.LSTMCell(width, size) if kind == "lstm" else nn.GRUCell(width, size)
    for name, param in cell.named_parameters():
        if name.startswith("weight"):
            nn.init.orthogonal_(param, 1.0)
        else:
            nn.init.zeros_(param)
    return cell


class ActorCritic(nn.Module):
    """Separate MLPs (tanh, or ReLU: `activation`) for the policy and the value, behind one
    convolutional encoder that both share when the run encodes images (`encoder`, resolved:
    `RunConfig.encoder_for`) and one recurrent core (`core`: "lstm" or "gru" of `core_size` units;
    "identity": none); Gaussian policies learn a state-free log standard deviation."""

    def __init__(
        self,
        spec: EnvSpec,
        hidden_sizes: tuple[int, ...],
        log_std_init: float = 0.0,
        encoder: str = "mlp",
        activation: Activation = "tanh",
        core: str = "identity",
        core_size: int = 0,
    ) -> None:
        super().__init__()
        self.discrete = spec.action_kind == "discrete"
        self.image = image_encoder(spec, encoder)
        if self.image is not None:  # first: its parameters lead the state dict, as the actors read it
            self.encoder = ConvEncoder(self.image)
        width = encoded_size(spec, encoder)
        self.recurrent = core != "identity"
        if self.recurrent:  # between the encoder and the heads, in the state dict too
            self.core = recurrent_cell(core, width, core_size)
            width = core_size
        self.policy = mlp([width, *hidden_sizes, spec.action_dim], 0.01, activation)
        self.value = mlp([width, *hidden_sizes, 1], 1.0, activation)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), log_std_init))

    def features(self, obs: Tensor) -> Tensor:
        """What the core (or, without one, the heads) takes: the encoded images, or the features."""
        return obs if self.image is None else encode(self.encoder, self.image.layout, obs)

    def trunk(self, obs: Tensor, memory: Memory | None = None) -> Tensor:
        """What the heads take for [R · N, obs_size] features: `features` through the core from
        `memory` (a recurrent network's: `Memory`)."""
        x = self.features(obs)
        if not self.recurrent:
            return x
        if memory is None:
            raise ValueError("a recurrent network steps from each slot's state: pass its memory")
        rows, slots = memory.starts.shape
        return cores.unroll_cell(self.core, x.view(rows, slots, -1), memory.state, memory.starts).flatten(0, 1)

    def forward(self, obs: Tensor, actions: Tensor, memory: Memory | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(log-probability of `actions`, entropy, value) — one call, so DDP sees every grad."""
        obs = self.trunk(obs, memory)
        value = self.value(obs).squeeze(-1)
        if self.discrete:  # by hand: torch.distributions' checks cost more than the maths here
            log_probs = torch.log_softmax(self.policy(obs), dim=-1)
            logp = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
            return logp, -(log_probs.exp() * log_probs).sum(-1), value
        dist = torch.distributions.Normal(self.policy(obs), self.log_std.exp())
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1), value


def obs_features(obs: Tensor, spec: EnvSpec) -> Tensor:
    """[..., *obs_shape] observations in their own dtype → [..., obs_size] float32, the networks'
    input: flattened, or one-hot for a Discrete observation (as common/schema.py does for actors)."""
    lead = obs.shape[: obs.ndim - len(spec.obs_shape)]
    if spec.obs_parts:  # each part's bytes read back in its dtype (common/schema.py, ObsPart)
        features, start = [], 0
        for part in spec.obs_parts:
            raw = obs[..., start : start + part.nbytes].contiguous().view(getattr(torch, part.dtype))
            features.append(raw.reshape(*lead, part.size).float())
            start += part.nbytes
        return torch.cat(features, dim=-1)
    if spec.obs_categories:
        return nn.functional.one_hot(obs.long(), spec.obs_categories).float()
    return obs.reshape(*lead, spec.obs_size).float()


class Stacked(nn.Module):
    """The parameters of P members of one module, stacked: one forward pass for the whole population.

    Every member's parameters are one row of a single [P, D] parameter, so DDP (or a manual
    all-reduce) syncs one tensor, the optimizer steps one tensor, and a PBT copy is one row
    assignment. The named tensors of a member are views into its row, laid out as the member
    module's state dict (whose names the actors read); `mlp` runs an `nn.Sequential` of Linears as
    batched matmuls over the member axis (Fast Population-Based RL, Flajolet et al. 2022), `encode`
    the members' convolutional encoder (``encoder.*``, `image`) as grouped convolutions.
    """

    STATE = ("flat",)  # what a checkpoint saves (learners/checkpoint.py)

    def __init__(
        self, members: list[nn.Module], image: ImageEncoder | None = None, activation: Activation = "relu"
    ) -> None:
        super().__init__()
        self.population, self.image, self.activation = len(members), image, activation
        self.layout: dict[str, tuple[int, torch.Size]] = {}
        offset = 0
        for name, tensor in members[0].state_dict().items():
            self.layout[name] = (offset, tensor.shape)
            offset += tensor.numel()
        rows = [torch.cat([t.reshape(-1) for t in m.state_dict().values()]) for m in members]
        self.flat = nn.Parameter(torch.stack(rows))
        # Each member's hidden activation as codes [P] where PBT mutates activations; None:
        # `activation`, every member's. Set from the hyperparameters (`set_activations`), which a
        # checkpoint holds, so it is not state of its own.
        self.activations: Tensor | None = None
        # Each member's units in use per hidden layer [P, L] where PBT changes widths or depth (the
        # layers are allocated wider and deeper: learners/shapes.py; 0: the layer is absent and
        # passes its input through, `passes`); None: all. From the hyperparameters too.
        self.widths: Tensor | None = None
        self.passes: Passes | None = None
        self.allocated_wider = False  # the trainer's: members may use narrower layers

    def set_activations(self, codes: Tensor | None) -> None:
        """Each member's hidden activation from now on (`stacked_mlp.Activations` codes [P])."""
        self.activations = None if codes is None else codes.to(self.flat.device)

    @torch.no_grad()
    def set_widths(self, widths: Tensor | None) -> Tensor | None:
        """Each member's hidden widths [P, L] from now on (0: no layer): the units beyond them
        zeroed. Returns the mask of the parameters in use [P, D] (None: every one), for the
        optimizer's moments."""
        self.widths = widths
        self.passes = None if widths is None else layer_passes(widths.to(self.flat.device))
        if widths is None:
            return None
        keep = width_mask(self.layout, widths.to(self.flat.device), self.flat.shape[1])
        self.flat.mul_(keep)
        return keep

    def grow(self, member: int, before: tuple[int, ...], after: tuple[int, ...], seed: int) -> None:
        """`member`'s new units from `before` to `after` widths start as a fresh layer's
        (learners/shapes.py, `grow`)."""
        grow_units(self.flat, self.layout, member, before, after, seed)

    @torch.no_grad()
    def add_noise(self, member: int, std: float, seed: int) -> None:
        """Gaussian noise of `std` on every parameter of `member` (PBT's parameter noise after a
        copy), drawn from `seed` on the CPU: every rank, on any device, adds the same."""
        if std > 0:
            noise = torch.randn(self.flat.shape[1], generator=torch.Generator().manual_seed(seed))
            self.flat[member] += std * noise.to(self.flat.device, self.flat.dtype)

    def tensor(self, name: str) -> Tensor:
        """The named tensor of every member: [P, *shape], a view into `flat`."""
        offset, shape = self.layout[name]
        return self.flat[:, offset : offset + shape.numel()].view(self.population, *shape)

    def tensors(self, names: list[str]) -> list[Tensor]:
        """The named tensors of every member, [P, *shape] each: the pieces of one split of the stretch
        of `flat` that holds them. Their gradients then come back as one tensor of that stretch and
        one of `flat`'s size; a view each (`tensor`) would allocate and zero one of `flat`'s size
        each, which for a population of large members cost about as much as the convolutions' backward."""
        spans = [self.layout[name] for name in names]
        start, end = min(o for o, _ in spans), max(o + shape.numel() for o, shape in spans)
        inside = [(name, shape) for name, (o, shape) in self.layout.items() if start <= o < end]  # in order
        stretch = self.flat if (start, end) == (0, self.flat.shape[1]) else self.flat[:, start:end]
        pieces = torch.split(stretch, [shape.numel() for _, shape in inside], dim=1)
        views = {name: piece.view(self.population, *shape) for (name, shape), piece in zip(inside, pieces, strict=True)}
        return [views[name] for name in names]

    def encode(self, obs: Tensor) -> Tensor:
        """[P, N, obs_size] features → [P, N, width] the heads take: through the encoder, if any."""
        if self.image is None:
            return obs
        convs = self.image.conv_names
        both = self.tensors([f"{c}.{kind}" for kind in ("weight", "bias") for c in convs])
        return stacked_encode(obs, both[: len(convs)], both[len(convs) :], self.image)

    def core_weights(self) -> dict[str, Tensor]:
        """Every member's recurrent core weights [P, ...], by `nn.LSTMCell`'s/`nn.GRUCell`'s names."""
        return dict(zip((name.split(".")[1] for name in CORE_WEIGHTS), self.tensors(list(CORE_WEIGHTS)), strict=True))

    def linear_names(self, prefix: str) -> list[tuple[str, str]]:
        """[(weight, bias)] of the Linears of nn.Sequential `prefix`, in order (even indices)."""
        count = sum(1 for name in self.layout if name.startswith(f"{prefix}.") and name.endswith(".weight"))
        return [(f"{prefix}.{2 * i}.weight", f"{prefix}.{2 * i}.bias") for i in range(count)]

    def tower(self, layers: list[tuple[str, str]], *, outputs_first: bool = False) -> Tower:
        """The named Linears as a `Tower` of `flat`, for `stacked_towers`."""
        linears = []
        for weight, bias in layers:
            offset, (out, inp) = self.layout[weight]
            linears.append((offset, out, inp, self.layout[bias][0]))
        return Tower(tuple(linears), self.hidden_activation(), outputs_first, self.passes)

    def hidden_activation(self) -> Activations:
        """What `stacked_mlp` takes: each member's code where `set_activations` gave them, else `activation`."""
        return self.activation if self.activations is None else self.activations

    def mlp(self, layers: list[tuple[str, str]], x: Tensor, *, outputs_first: bool = False) -> Tensor:
        """[P, N, in] → [P, N, out] ([P, out, N] if `outputs_first`) through the named Linears,
        the hidden activation between them, as one `stacked_mlp`."""
        both = self.tensors([name for pair in zip(*layers, strict=True) for name in pair])
        return stacked_mlp(
            x,
            both[: len(layers)],
            both[len(layers) :],
            self.hidden_activation(),
            outputs_first=outputs_first,
            passes=self.passes,
        )

    def member_params(self, member: int) -> dict[str, np.ndarray]:
        """One member's parameters under the member module's names, as actors and Weights take them."""
        row = self.flat.detach()[member].to("cpu", torch.float32)
        params = {name: row[o : o + s.numel()].view(s).numpy().copy() for name, (o, s) in self.layout.items()}
        return params if self.widths is None else trimmed(params, self.layout, self.widths[member].tolist())

    def load_member(self, member: int, params: dict[str, np.ndarray]) -> None:
        """Set one member's parameters; where the layers are `allocated_wider`, its MLP layers may
        be narrower (weights a member of mutated widths published), and are zero-padded."""
        if self.allocated_wider:
            params = padded(params, self.layout)
        if set(params) != set(self.layout):
            raise KeyError(f"member weights hold {sorted(params)}, the network {sorted(self.layout)}")
        with torch.no_grad():
            for name, (offset, shape) in self.layout.items():
                array = np.array(params[name], dtype=np.float32)  # a copy: wire arrays are read-only
                if array.shape != shape:
                    raise ValueError(f"{name}: {tuple(array.shape)}, the network has {tuple(shape)}")
                value = torch.from_numpy(array)
                self.flat[member, offset : offset + shape.numel()] = value.reshape(-1).to(self.flat.device)


class PopulationActorCritic(Stacked):
    """P members of `ActorCritic`, stacked (see `Stacked`)."""

    def __init__(
        self,
        spec: EnvSpec,
        hidden_sizes: tuple[int, ...],
        population: int,
        log_std_init: float = 0.0,
        encoder: str = "mlp",
        activation: Activation = "tanh",
        core: str = "identity",
        core_size: int = 0,
    ) -> None:
        # Members are initialised exactly as single agents, one after the other (same RNG draws).
        super().__init__(
            [
                ActorCritic(spec, hidden_sizes, log_std_init, encoder, activation, core, core_size)
                for _ in range(population)
            ],
            image_encoder(spec, encoder),
            activation,
        )
        self.discrete, self.core_kind = spec.action_kind == "discrete", core
        # Discrete logits come out as [P, A, N]: log_softmax along a narrow last dimension is several
        # times slower than along the middle one (benchmarks/LOG.md §4). Gaussian means as [P, N, A].
        self.towers = self.both_towers()

    def both_towers(self) -> tuple[Tower, Tower]:
        return (
            self.tower(self.linear_names("policy"), outputs_first=self.discrete),
            self.tower(self.linear_names("value"), outputs_first=True),
        )

    def set_activations(self, codes: Tensor | None) -> None:
        super().set_activations(codes)
        self.towers = self.both_towers()

    def set_widths(self, widths: Tensor | None) -> Tensor | None:
        keep = super().set_widths(widths)
        self.towers = self.both_towers()
        return keep

    @property
    def recurrent(self) -> bool:
        return self.core_kind != "identity"

    def trunk(self, obs: Tensor, memory: Memory | None = None) -> Tensor:
        """[P, R · N, obs_size] features → [P, R · N, width] the heads take: encoded, then through
        every member's core at once (`cores.unroll`) from `memory` [P, ...] where there is one."""
        x = self.encode(obs)
        if not self.recurrent:
            return x
        if memory is None:
            raise ValueError("a recurrent network steps from each slot's state: pass its memory")
        population, rows, slots = memory.starts.shape
        out, _ = cores.unroll(
            self.core_kind, x.view(population, rows, slots, -1), memory.state, memory.starts, self.core_weights()
        )
        return out.flatten(1, 2)

    @torch.no_grad()
    def states_every(self, obs: Tensor, memory: Memory, every: int) -> Tensor:
        """[P, C, N, S]: each slot's core state entering rows 0, every, 2 · every, ... (before
        the reset of an episode starting there) of [P, R · N, obs_size] features unrolled from
        `memory`, C = R / every: where the chunks of truncated backpropagation start."""
        population, rows, slots = memory.starts.shape
        x, weights = self.encode(obs).view(population, rows, slots, -1), self.core_weights()
        state, states = memory.state, [memory.state]
        for start in range(every, rows, every):
            chunk = slice(start - every, start)
            _, state = cores.unroll(self.core_kind, x[:, chunk], state, memory.starts[:, chunk], weights)
            states.append(state)
        return torch.stack(states, dim=1)

    def logp_and_values(self, obs: Tensor, actions: Tensor, memory: Memory | None = None) -> tuple[Tensor, Tensor]:
        """(log-probability [P, n] of `actions` [P, n, ...] at the first n observations, value
        [P, N] of every observation) in one pass: an image encoder runs once over all N."""
        out, value = stacked_towers(self.trunk(obs, memory), self.flat, self.towers)
        n = actions.shape[1]
        logp, _ = self.log_prob_and_entropy(out[:, :, :n] if self.discrete else out[:, :n], actions)
        return logp, value.squeeze(1)

    def log_prob_and_entropy(self, out: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """From the policy tower's output: by hand, as ActorCritic.forward."""
        if self.discrete:
            log_probs = torch.log_softmax(out, dim=1)
            logp = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
            return logp, -(log_probs.exp() * log_probs).sum(1)
        log_std = self.tensor("log_std").unsqueeze(1)  # [P, 1, A]
        z = (actions - out) * torch.exp(-log_std)
        logp = (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1).expand_as(logp)
        return logp, entropy

    def forward(self, obs: Tensor, actions: Tensor | None, memory: Memory | None = None) -> tuple[Tensor, ...]:
        """(log-probability of `actions`, entropy, value), each [P, N] — one call, so DDP sees every
        grad. With `actions` None (discrete actions only): (logits [P, A, N], value [P, N]), for
        `ppo_logits.ppo_loss_from_logits`. Both towers are one `stacked_towers`."""
        out, value = stacked_towers(self.trunk(obs, memory), self.flat, self.towers)
        if actions is None:
            if not self.discrete:
                raise ValueError("logits are for discrete actions: pass the actions")
            return out, value.squeeze(1)
        return (*self.log_prob_and_entropy(out, actions), value.squeeze(1))
