"""The encoders' forward pass in torch (declared in `rlmq.common.images`): the walk over a plan
that the learners' networks (`rlmq.learners.encoders`) and the exported policy build on, and
`TorchEncoder`, the actors' forward pass for the encoders that run faster in torch than in NumPy.

An actor imports this module only when its policy's encoder is one of `images.TORCH_IN_ACTORS`:
actors of flat observations and of MinAtar's small network stay torch-free.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.images import Conv, ImageLayout, Layer, MaxPool, NumpyEncoder, ReLU, Skip

ConvCall = Callable[[int, Tensor, Conv], Tensor]  # (convolution's index, input, its declaration) → output


def images(features: Tensor, layout: ImageLayout) -> Tensor:
    """[N, obs_size] features → [N, C, H, W] images, bytes scaled to [0, 1]."""
    x = features.reshape(len(features), *layout.shape)
    if layout.channels_last:
        x = x.permute(0, 3, 1, 2)
    return x * layout.scale if layout.scale != 1.0 else x


def run_plan(plan: tuple[Layer, ...], x: Tensor, conv: ConvCall) -> Tensor:
    """[N, C, H, W] through `plan`, each convolution by `conv` (one member's weights, or the
    population's grouped)."""
    index, skip = 0, x
    for layer in plan:
        if isinstance(layer, Conv):
            x = conv(index, x, layer)
            index += 1
            if layer.relu:
                x = x.relu_()  # a fresh output: nothing else holds it
        elif isinstance(layer, MaxPool):
            x = nn.functional.max_pool2d(x, layer.kernel, layer.stride, layer.padding)
        elif isinstance(layer, ReLU):
            x = x.relu()  # not in place: a `Skip` may hold x
        elif isinstance(layer, Skip):
            skip = x
        else:
            x = x + skip
    return x


class TorchEncoder:
    """A `NumpyEncoder`'s weights run by torch: the same features in, the same encoding out
    (float32 roundings apart), on the process's torch threads (an actor's: one)."""

    def __init__(self, encoder: NumpyEncoder) -> None:
        self.layout, self.plan = encoder.layout, encoder.plan
        self.weights = [(torch.from_numpy(np.ascontiguousarray(columns.T))
                         .reshape(conv.channels, -1, conv.kernel, conv.kernel),
                         torch.from_numpy(bias)) for columns, bias, conv in encoder.convs]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """[N, obs_size] float32 features → [N, size], as `NumpyEncoder`."""

        def conv(i: int, x: Tensor, layer: Conv) -> Tensor:
            weight, bias = self.weights[i]
            return nn.functional.conv2d(x, weight, bias, layer.stride, layer.padding)

        with torch.inference_mode():
            out = run_plan(self.plan, images(torch.from_numpy(features), self.layout), conv)
            encoded: np.ndarray = out.flatten(1).numpy()
        return encoded
