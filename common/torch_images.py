"""The encoders' forward pass in torch (declared in `rlmq.common.images`): the walk over a plan
that the learners' networks (`rlmq.learners.encoders`) and the exported policy build on;
`TorchEncoder`, the actors' forward pass for the encoders that run faster in torch than in NumPy;
and `DeviceForward`, an image policy's whole forward pass on a GPU, a lane of slots at a time.

An actor imports this module only when its policy's encoder is one of `images.TORCH_IN_ACTORS`:
actors of flat observations and of MinAtar's small network stay torch-free.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from rlmq.common.images import Conv, ImageLayout, Layer, MaxPool, NumpyEncoder, ReLU, Skip
from rlmq.common.schema import ObsNorm

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
        self.weights = [
            (
                torch.from_numpy(np.ascontiguousarray(columns.T)).reshape(conv.channels, -1, conv.kernel, conv.kernel),
                torch.from_numpy(bias),
            )
            for columns, bias, conv in encoder.convs
        ]

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """[N, obs_size] float32 features → [N, size], as `NumpyEncoder`."""

        def conv(i: int, x: Tensor, layer: Conv) -> Tensor:
            weight, bias = self.weights[i]
            return nn.functional.conv2d(x, weight, bias, layer.stride, layer.padding)

        with torch.inference_mode():
            pixels = torch.from_numpy(features[:, : self.layout.size])
            encoded: np.ndarray = run_plan(self.plan, images(pixels, self.layout), conv).flatten(1).numpy()
        rest = features[:, self.layout.size :]
        return np.concatenate([encoded, rest], axis=1) if rest.shape[1] else encoded


# Host buffers the observations are staged in before they go to a GPU, by (shape, dtype): pinned
# (page-locked) memory, which a copy to the GPU reads without first copying it again, costs a
# driver call to allocate, so it is allocated once per shape and kept across policy versions. Lanes
# of one size share a buffer: each call waits for its output (`.cpu()`), and so for its copy in,
# before the next call fills the buffer again. Beyond STAGING_KEPT shapes the old ones are let go.
_STAGING: dict[tuple[tuple[int, ...], torch.dtype], Tensor] = {}
STAGING_KEPT = 4


def staging(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    key = (shape, dtype)
    if key not in _STAGING:
        if len(_STAGING) >= STAGING_KEPT:
            _STAGING.clear()
        _STAGING[key] = torch.empty(shape, dtype=dtype, pin_memory=True)
    return _STAGING[key]


class DeviceForward:
    """An image policy's forward pass on `device`: observations as the env gives them (bytes stay
    bytes until they are on the device), observation statistics, the encoder and the MLP `layers`
    (none: the encoding, for a recurrent policy's core on the host), output back on the host.
    The same output as `NumpyPolicy.forward` (float32 roundings apart). The weights are copied to
    the device once per policy version; each call is one copy there and one back, through a
    pinned buffer kept across versions."""

    def __init__(
        self,
        encoder: NumpyEncoder,
        layers: list[tuple[np.ndarray, np.ndarray]],
        activation: str,
        norm: ObsNorm | None,
        device: str,
    ) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"  # observations staged in pinned memory

        def put(array: np.ndarray) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

        self.layout, self.plan = encoder.layout, encoder.plan
        self.convs = [
            (put(columns.T).reshape(conv.channels, -1, conv.kernel, conv.kernel), put(bias))
            for columns, bias, conv in encoder.convs
        ]
        self.layers = [(put(weight), put(bias)) for weight, bias in layers]  # [in, out]: x @ W + b
        self.activation = {"tanh": torch.tanh, "relu": torch.relu, "elu": torch.nn.functional.elu}[activation]
        self.norm = None if norm is None else (put(norm.mean), put(norm.std), norm.clip)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """[N, *obs_shape] observations → [N, outputs] float32. The convolutions in full float32
        (cuDNN rounds through TF32 by default; torch's matmuls do not), so that a GPU chooses the
        actions the reference policy would for the same observations."""
        with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            host = torch.from_numpy(obs)
            if self.pinned:
                buffer = staging(tuple(obs.shape), host.dtype)
                buffer.copy_(host)
                host = buffer
            x = host.to(self.device, non_blocking=True).reshape(len(obs), -1).float()
            if self.norm is not None:
                mean, std, clip = self.norm
                x = ((x - mean) / std).clamp_(-clip, clip)

            def conv(i: int, x: Tensor, layer: Conv) -> Tensor:
                weight, bias = self.convs[i]
                return nn.functional.conv2d(x, weight, bias, layer.stride, layer.padding)

            x = run_plan(self.plan, images(x, self.layout), conv).flatten(1)
            if not self.layers:
                encoded: np.ndarray = x.cpu().numpy()
                return encoded
            for weight, bias in self.layers[:-1]:
                x = self.activation(torch.addmm(bias, x, weight))
            weight, bias = self.layers[-1]
            out: np.ndarray = torch.addmm(bias, x, weight).cpu().numpy()  # waits for the device
        return out
