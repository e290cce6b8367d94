"""The convolutional encoder in torch (declared in `rlmq.common.images`): one member's, and a whole
population's as grouped convolutions, one kernel call per layer for every member.

A member's encoder is an `nn.Sequential` of Conv2d and ReLU whose state-dict names
(``encoder.{2i}.weight``) the actors' `NumpyEncoder` reads. P members stacked (`networks.Stacked`)
keep their convolution weights as [P, out, in, k, k] views into their one flat parameter. On a GPU
the population's images go through `conv2d(groups=P)` with the members side by side along the
channel axis: each member's output channels see only its own input channels and kernels, so the
result equals P separate convolutions, in one kernel launch per layer. On the CPU oneDNN's grouped
kernels (4 or 32 channels a group) took twice as long as one ordinary convolution per member
(benchmarks/RESULTS.md §10), so there each member's convolutions run in turn; the heads behind
them stay one batched matmul for the population. Both ways are held to the loop over members
(`tests/test_encoders.py`, `tests/test_population.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rlmq.common.images import ENCODERS, Conv, ImageLayout, image_layout
from rlmq.common.schema import EnvSpec


class ImageEncoder(NamedTuple):
    """What a network needs to encode observations: their layout and the convolutions."""

    layout: ImageLayout
    convs: tuple[Conv, ...]


def image_encoder(spec: EnvSpec, encoder: str) -> ImageEncoder | None:
    """The encoder named `encoder` (resolved: `RunConfig.encoder_for`) for `spec`, or None ("mlp")."""
    layout = image_layout(spec)
    if encoder == "mlp" or layout is None:
        return None
    return ImageEncoder(layout, ENCODERS[encoder])


def conv_stack(image: ImageEncoder) -> nn.Sequential:
    """One member's convolutions and ReLUs, orthogonally initialised with gain √2 (as CleanRL)."""
    layers: list[nn.Module] = []
    channels = image.layout.channels
    for conv in image.convs:
        layer = nn.Conv2d(channels, conv.channels, conv.kernel, conv.stride)
        nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
        nn.init.zeros_(layer.bias)  # type: ignore[arg-type]  # Conv2d's bias is there (bias=True)
        layers += [layer, nn.ReLU()]
        channels = conv.channels
    return nn.Sequential(*layers)


def images(features: Tensor, layout: ImageLayout) -> Tensor:
    """[N, obs_size] features → [N, C, H, W] images, bytes scaled to [0, 1]."""
    x = features.reshape(len(features), *layout.shape)
    if layout.channels_last:
        x = x.permute(0, 3, 1, 2)
    return x * layout.scale if layout.scale != 1.0 else x


def encode(convs: nn.Sequential, layout: ImageLayout, features: Tensor) -> Tensor:
    """One member: [..., obs_size] features → [..., encoded size], flattened channel-major."""
    lead = features.shape[:-1]
    out: Tensor = convs(images(features.reshape(-1, features.shape[-1]), layout))
    return out.reshape(*lead, -1)


def stacked_encode(features: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], image: ImageEncoder,
                   grouped: bool | None = None) -> Tensor:  # fmt: skip
    """P members: [P, N, obs_size] features, each layer's weights [P, out, in, k, k] and biases
    [P, out] → [P, N, encoded size]; through one grouped convolution per layer if `grouped`
    (None: on a GPU), else through each member's convolutions in turn."""
    if not (features.is_cuda if grouped is None else grouped):
        members = []
        for m, member_features in enumerate(features):
            x = images(member_features, image.layout)
            for weight, bias, conv in zip(weights, biases, image.convs, strict=True):
                x = nn.functional.conv2d(x, weight[m], bias[m], stride=conv.stride).relu_()
            members.append(x.flatten(1))
        return torch.stack(members)
    population, samples = features.shape[:2]
    x = images(features.reshape(population * samples, -1), image.layout)  # [P·N, C, H, W]
    x = x.reshape(population, samples, *x.shape[1:]).transpose(0, 1)  # [N, P, C, H, W]
    x = x.reshape(samples, -1, *x.shape[3:])  # members side by side along the channels
    for weight, bias, conv in zip(weights, biases, image.convs, strict=True):
        x = nn.functional.conv2d(x, weight.reshape(-1, *weight.shape[2:]), bias.reshape(-1), stride=conv.stride,
                                 groups=population).relu_()  # fmt: skip
    return x.reshape(samples, population, -1).transpose(0, 1).contiguous()
