"""`rlmq export`: a checkpoint's deterministic policy as one self-contained TorchScript file, with
the observation encoding and normalization folded in, that plain torch runs without rlmq.

The exported module is built from the actors' NumPy policy (`NumpyPolicy`: its layers,
activation, observation statistics and deterministic head), so it acts exactly as `rlmq eval`:

    import torch
    policy = torch.jit.load("policy.pt")
    obs = torch.as_tensor(env.reset(seed=0)[0])[None]  # [N, *observation shape], the env's dtype
    action = policy(obs)[0].numpy()                      # int64 index, or float32 in the bounds
    env.step(action)

A recurrent policy also takes each slot's state, [N, S] float32 (`rlmq export` prints S; zeros
where an episode starts), and returns the next one: ``action, state = policy(obs, state)``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.cli.evaluate import Checkpoint, policy_of
from rlmq.common.images import Layer
from rlmq.common.models import NumpyPolicy
from rlmq.common.schema import ObsPart
from rlmq.common.torch_images import run_plan


class ExportedPolicy(nn.Module):
    """Observations [N, *obs_shape] in the env's dtype → deterministic actions [N, ...]; a Dict or
    Tuple observation as one tensor per part, [N, *part shape] each, in the order of the spec's
    parts (`rlmq export` prints it). A recurrent policy takes the slots' state [N, S] after them
    and returns (actions, next state)."""

    def __init__(self, policy: NumpyPolicy) -> None:
        super().__init__()
        spec = self.spec = policy.spec
        self.categories, self.activation, self.head = spec.obs_categories, policy.activation_name, policy.head
        self.convs = nn.ModuleList()  # the convolutional encoder's, if the policy has one
        encoder = policy.encoder
        self.plan: tuple[Layer, ...] = ()
        self.image_shape, self.channels_last, self.pixel_scale = (1, 1, 1), False, 1.0
        self.beside = False
        if encoder is not None:
            layout, self.plan = encoder.layout, encoder.plan
            self.beside = spec.obs_size > layout.size  # a composite observation's other parts
            self.image_shape, self.channels_last, self.pixel_scale = layout.shape, layout.channels_last, layout.scale
            for columns, bias, conv in encoder.convs:  # columns [C·k·k, out], as NumpyEncoder multiplies
                layer = nn.Conv2d(
                    columns.shape[0] // conv.kernel**2, conv.channels, conv.kernel, conv.stride, conv.padding
                )
                layer.weight.data = torch.from_numpy(np.ascontiguousarray(columns.T)).reshape(layer.weight.shape)
                layer.bias = nn.Parameter(torch.from_numpy(bias))
                self.convs.append(layer)
        core = policy.core
        self.recurrent, self.lstm, self.hidden = core is not None, core is not None and core.kind == "lstm", 0
        if core is not None:  # the actors' cell, as torch's own module
            self.hidden, self.state_size = core.size, core.state_size
            cell = (
                nn.LSTMCell(core.weight_ih.shape[1], core.size)
                if self.lstm
                else nn.GRUCell(core.weight_ih.shape[1], core.size)
            )
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).data = torch.from_numpy(np.array(getattr(core, name)))
            self.core = cell
        self.linears = nn.ModuleList()
        for weight_t, bias in policy.layers:  # stored transposed for x @ W
            linear = nn.Linear(*weight_t.shape)
            linear.weight.data = torch.from_numpy(np.ascontiguousarray(weight_t.T)).float()
            linear.bias.data = torch.from_numpy(bias).float()
            self.linears.append(linear)
        norm = policy.norm
        self.normalize, self.clip = norm is not None, norm.clip if norm is not None else 0.0
        self.bounded = policy.head == "mean" and bool(spec.action_low)  # a Gaussian mean is clipped
        self.mean: Tensor
        self.std: Tensor
        self.scale: Tensor
        self.bias: Tensor
        self.register_buffer("mean", torch.from_numpy(norm.mean if norm else np.zeros(spec.obs_size, np.float32)))
        self.register_buffer("std", torch.from_numpy(norm.std if norm else np.ones(spec.obs_size, np.float32)))
        self.register_buffer("scale", torch.from_numpy(policy.scale))
        self.register_buffer("bias", torch.from_numpy(policy.bias))

    def forward(self, *parts: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        state = parts[-1]
        if self.recurrent:
            parts = parts[:-1]
        obs = parts[0]
        if self.spec.obs_parts:
            x = torch.cat([part.flatten(1).float() for part in parts], dim=1)
        elif self.categories:
            x = nn.functional.one_hot(obs.long(), self.categories).float()
        else:
            x = obs.flatten(1).float()
        if self.normalize:
            x = ((x - self.mean) / self.std).clamp(-self.clip, self.clip)
        if len(self.convs):
            size = self.image_shape[0] * self.image_shape[1] * self.image_shape[2]
            rest = x[:, size:]  # a composite observation's other parts go past the encoder
            x = x[:, :size].reshape(x.shape[0], self.image_shape[0], self.image_shape[1], self.image_shape[2])
            if self.channels_last:
                x = x.permute(0, 3, 1, 2)
            x = run_plan(self.plan, x * self.pixel_scale, lambda i, inputs, _conv: self.convs[i](inputs)).flatten(1)
            if self.beside:
                x = torch.cat([x, rest], dim=1)
        if self.recurrent and self.lstm:
            h, c = self.core(x, (state[:, : self.hidden], state[:, self.hidden :]))
            x, state = h, torch.cat([h, c], dim=1)
        elif self.recurrent:
            x = state = self.core(x, state)
        action = self.head_of(x)
        return (action, state) if self.recurrent else action

    def head_of(self, x: Tensor) -> Tensor:
        """The deterministic action from the heads' input."""
        for i, linear in enumerate(self.linears):
            x = linear(x)
            if i < len(self.linears) - 1:
                if self.activation == "relu":
                    x = torch.relu(x)
                elif self.activation == "elu":
                    x = nn.functional.elu(x)
                else:
                    x = torch.tanh(x)
        if self.head == "argmax":
            return x.argmax(-1)
        if self.head == "mean":
            return (
                torch.maximum(torch.minimum(x, self.bias + self.scale), self.bias - self.scale) if self.bounded else x
            )
        if self.head == "squashed_mean":
            x = x.chunk(2, dim=-1)[0]
        return torch.tanh(x) * self.scale + self.bias


def export(checkpoint: Checkpoint, out: Path) -> Path:
    """Write `out` (TorchScript, traced on an observation of the env's shape and dtype)."""
    module = ExportedPolicy(policy_of(checkpoint)).eval().requires_grad_(False)
    spec = checkpoint.spec
    pieces = spec.obs_parts or (ObsPart("obs", spec.obs_shape, spec.obs_dtype),)
    example = tuple(torch.zeros((2, *p.shape), dtype=getattr(torch, p.dtype)) for p in pieces)
    if module.recurrent:
        example += (torch.zeros(2, module.state_size),)
    with warnings.catch_warnings():  # torch 2.13 marks TorchScript deprecated; it still loads everywhere
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, example)
    out.parent.mkdir(parents=True, exist_ok=True)
    traced.save(str(out))
    return out
