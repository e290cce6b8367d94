"""The convolutional encoder in torch (declared in `rlmq.common.images`): one member's, and a whole
population's as grouped convolutions, one kernel call per layer for every member.

A member's encoder is a `ConvEncoder` whose i-th convolution is its submodule ``{2i}``, so that
its state-dict names (``encoder.{2i}.weight``) are those the actors' `NumpyEncoder` reads (and, for
a plain stack, those of an `nn.Sequential` of Conv2d and ReLU). P members stacked
(`networks.Stacked`) keep their convolution weights as [P, out, in, k, k] views into their one flat
parameter. On a GPU the population's images go through `conv2d(groups=P)` with the members side by
side along the channel axis: each member's output channels see only its own input channels and
kernels, so the result equals P separate convolutions, in one kernel launch per layer (pooling,
ReLUs and residual sums act on each channel alone, so they need no change). On the CPU oneDNN's
grouped kernels (4 or 32 channels a group) are slower than one ordinary convolution per member
(benchmarks/LOG.md §10), so there each member's layers run in turn; the heads behind them stay
one batched matmul for the population. All three ways walk the same plan (`torch_images.run_plan`) and are held
to one another (`tests/test_encoders.py`, `tests/test_population.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rlmq.common.images import ENCODERS, Conv, ImageLayout, Layer, convolutions, image_layout
from rlmq.common.schema import EnvSpec
from rlmq.common.torch_images import images, run_plan


class ImageEncoder(NamedTuple):
    """What a network needs to encode observations: their layout and the encoder's plan."""

    layout: ImageLayout
    plan: tuple[Layer, ...]

    @property
    def conv_names(self) -> list[str]:
        """The state-dict prefix of each convolution, in the plan's order."""
        return [f"encoder.{2 * i}" for i in range(len(convolutions(self.plan)))]


def image_encoder(spec: EnvSpec, encoder: str) -> ImageEncoder | None:
    """The encoder named `encoder` (resolved: `RunConfig.encoder_for`) for `spec`, or None ("mlp")."""
    layout = image_layout(spec)
    if encoder == "mlp" or layout is None:
        return None
    return ImageEncoder(layout, ENCODERS[encoder])


class ConvEncoder(nn.Module):
    """One member's encoder: the plan's convolutions as submodules ``0``, ``2``, ``4``, …,
    orthogonally initialised with gain √2 (as CleanRL)."""

    def __init__(self, image: ImageEncoder) -> None:
        super().__init__()
        self.plan = image.plan
        channels = image.layout.channels
        for i, conv in enumerate(convolutions(self.plan)):
            layer = nn.Conv2d(channels, conv.channels, conv.kernel, conv.stride, conv.padding)
            nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
            nn.init.zeros_(layer.bias)  # type: ignore[arg-type]  # Conv2d's bias is there (bias=True)
            self.add_module(str(2 * i), layer)
            channels = conv.channels

    def conv(self, index: int) -> nn.Conv2d:
        layer: nn.Conv2d = getattr(self, str(2 * index))
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return run_plan(self.plan, x, lambda i, inputs, _conv: self.conv(i)(inputs))


def encode(encoder: ConvEncoder, layout: ImageLayout, features: Tensor) -> Tensor:
    """One member: [..., obs_size] features → [..., encoded size], flattened channel-major; a
    composite observation's other parts appended as they are."""
    lead, pixels = features.shape[:-1], features[..., : layout.size]
    out: Tensor = encoder(images(pixels.reshape(-1, layout.size), layout)).reshape(*lead, -1)
    return torch.cat([out, features[..., layout.size :]], dim=-1) if features.shape[-1] > layout.size else out


def stacked_encode(
    features: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    image: ImageEncoder,
    grouped: bool | None = None,
) -> Tensor:
    """P members: [P, N, obs_size] features, each convolution's weights [P, out, in, k, k] and
    biases [P, out] → [P, N, encoded size]; through one grouped convolution per layer if `grouped`
    (None: on a GPU), else through each member's layers in turn. A composite observation's other
    parts are appended as they are."""
    size = image.layout.size
    if features.shape[-1] > size:
        encoded = stacked_encode(features[..., :size], weights, biases, image, grouped)
        return torch.cat([encoded, features[..., size:]], dim=-1)
    if not (features.is_cuda if grouped is None else grouped):
        members = []
        for m, member_features in enumerate(features):

            def member_conv(i: int, x: Tensor, conv: Conv, m: int = m) -> Tensor:
                return nn.functional.conv2d(x, weights[i][m], biases[i][m], conv.stride, conv.padding)

            members.append(run_plan(image.plan, images(member_features, image.layout), member_conv).flatten(1))
        return torch.stack(members)
    population, samples = features.shape[:2]

    def grouped_conv(i: int, x: Tensor, conv: Conv) -> Tensor:
        return nn.functional.conv2d(
            x,
            weights[i].reshape(-1, *weights[i].shape[2:]),
            biases[i].reshape(-1),
            conv.stride,
            conv.padding,
            groups=population,
        )

    x = images(features.reshape(population * samples, -1), image.layout)  # [P·N, C, H, W]
    x = x.reshape(population, samples, *x.shape[1:]).transpose(0, 1)  # [N, P, C, H, W]
    # members side by side along the channels
    x = run_plan(image.plan, x.reshape(samples, -1, *x.shape[3:]), grouped_conv)
    return x.reshape(samples, population, -1).transpose(0, 1).contiguous()
