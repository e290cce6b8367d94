"""Image observations: the convolutional encoders declared once, which one a run's networks put in
front of their heads, and the encoder's forward pass in NumPy, as the actors run it.

An encoder reads an observation as the networks' features give it (`schema.obs_features`: the
observation flattened to float32, normalized if the run normalizes observations), puts it back into
an image [C, H, W], scales bytes to [0, 1] and runs ReLU convolutions without padding; its output,
flattened channel-major as torch's `nn.Flatten` does, feeds the policy, value or Q heads. Learners
train it in torch (`rlmq.learners.encoders`), the actors run it here: the state-dict names
``encoder.{2i}.weight`` / ``encoder.{2i}.bias`` are the contract between the two.

An image is a Box of three dimensions: channels first ([C, H, W]: gymnasium's frame stack of
Atari frames) or last ([H, W, C]: MinAtar, most renders), told apart by which end is the narrower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlmq.common.schema import EnvSpec


@dataclass(frozen=True)
class Conv:
    """One convolution: output channels, square kernel, stride (no padding)."""

    channels: int
    kernel: int
    stride: int


ENCODERS: dict[str, tuple[Conv, ...]] = {
    # Mnih et al. 2015 (the Nature DQN), for 84×84 frames: 3,136 features.
    "nature": (Conv(32, 8, 4), Conv(64, 4, 2), Conv(64, 3, 1)),
    # Young & Tian 2019 (MinAtar's DQN and actor-critic), for 10×10 frames: 1,024 features.
    "minatar": (Conv(16, 3, 1),),
}
# What `RunConfig.encoder` may say: "auto" picks by the observation (`resolve_encoder`), "mlp" none.
ENCODER_CHOICES = ("auto", "mlp", *ENCODERS)
NATURE_MIN_SIDE = 36  # the Nature CNN's three layers need a side of at least 36 pixels


@dataclass(frozen=True)
class ImageLayout:
    """How an observation's flat features are an image."""

    channels: int
    height: int
    width: int
    channels_last: bool  # the observation is [H, W, C] (else [C, H, W])
    scale: float  # bytes are divided by 255; other dtypes are taken as they are

    @property
    def shape(self) -> tuple[int, int, int]:
        """The observation's own shape."""
        if self.channels_last:
            return self.height, self.width, self.channels
        return self.channels, self.height, self.width


def image_layout(spec: EnvSpec) -> ImageLayout | None:
    """The layout of a three-dimensional Box observation; None for anything else."""
    if len(spec.obs_shape) != 3 or spec.obs_categories:
        return None
    first, _middle, last = spec.obs_shape
    scale = 1 / 255 if spec.obs_dtype == "uint8" else 1.0
    if last < first:  # (10, 10, 4), (84, 84, 3): channels last
        height, width, channels = spec.obs_shape
        return ImageLayout(channels, height, width, True, scale)
    channels, height, width = spec.obs_shape
    return ImageLayout(channels, height, width, False, scale)


def conv_output(layout: ImageLayout, convs: tuple[Conv, ...]) -> tuple[int, int, int]:
    """(channels, height, width) after `convs`; a side below 1 means the image is too small."""
    channels, height, width = layout.channels, layout.height, layout.width
    for conv in convs:
        channels = conv.channels
        height, width = (height - conv.kernel) // conv.stride + 1, (width - conv.kernel) // conv.stride + 1
    return channels, height, width


def resolve_encoder(choice: str, spec: EnvSpec, takes_images: bool = True) -> str:
    """The encoder a run with `RunConfig.encoder = choice` uses: "auto" gives the Nature CNN for
    images of at least 36×36, MinAtar's for smaller ones, and "mlp" (none) for other observations
    or algorithms that do not take images (`takes_images`). A named encoder must fit the images."""
    layout = image_layout(spec)
    if choice == "auto":
        if layout is None or not takes_images:
            return "mlp"
        return "nature" if min(layout.height, layout.width) >= NATURE_MIN_SIDE else "minatar"
    if choice == "mlp":
        return choice
    if choice not in ENCODERS:
        raise ValueError(f"encoder {choice!r} is not one of {', '.join(ENCODER_CHOICES)}")
    if not takes_images:
        raise ValueError(f"this algorithm's networks take flat observations: use encoder = \"mlp\", not {choice!r}")
    if layout is None:
        raise ValueError(f"encoder {choice!r} needs a 3-D Box observation ([C, H, W] or [H, W, C]), "
                         f"not shape {spec.obs_shape}: use encoder = \"mlp\"")  # fmt: skip
    if min(conv_output(layout, ENCODERS[choice])[1:]) < 1:
        raise ValueError(f"encoder {choice!r} does not fit {layout.height}×{layout.width} images: use "
                         "\"minatar\" or \"mlp\"")  # fmt: skip
    return choice


def encoded_size(spec: EnvSpec, encoder: str) -> int:
    """The width of the heads' input: the encoder's flattened output, or the features themselves."""
    layout = image_layout(spec)
    if encoder == "mlp" or layout is None:
        return spec.obs_size
    return math.prod(conv_output(layout, ENCODERS[encoder]))


def encoder_layer_names(params: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """[(weight, bias)] of the encoder's convolutions in a member's weights, in order."""
    layers: list[tuple[str, str]] = []
    while f"encoder.{2 * len(layers)}.weight" in params:  # Conv2d, ReLU, ...: convolutions at even indices
        i = 2 * len(layers)
        layers.append((f"encoder.{i}.weight", f"encoder.{i}.bias"))
    return layers


class NumpyEncoder:
    """The encoder's forward pass in NumPy: each convolution one matmul over the image's windows
    (im2col by `sliding_window_view`), channels last throughout, as BLAS likes it."""

    def __init__(self, params: dict[str, np.ndarray], spec: EnvSpec, encoder: str) -> None:
        layout = image_layout(spec)
        names = encoder_layer_names(params)
        if layout is None or encoder not in ENCODERS or len(names) != len(ENCODERS[encoder]):
            raise ValueError(f"weights hold {len(names)} encoder convolutions, the run's encoder "
                             f"{encoder!r} for observations {spec.obs_shape} needs {len(ENCODERS.get(encoder, ()))}")  # fmt: skip
        self.layout, self.convs = layout, ENCODERS[encoder]
        # (weight [C·k·k, out] in the windows' (C, kh, kw) order, bias [out], the convolution)
        self.layers: list[tuple[np.ndarray, np.ndarray, Conv]] = []
        channels = layout.channels
        for conv, (w, b) in zip(self.convs, names, strict=True):
            weight, bias = params[w].astype(np.float32), params[b].astype(np.float32)
            if weight.shape != (conv.channels, channels, conv.kernel, conv.kernel) or bias.shape != (conv.channels,):
                raise ValueError(f"{w} is {weight.shape}, the encoder needs "
                                 f"{(conv.channels, channels, conv.kernel, conv.kernel)}")  # fmt: skip
            self.layers.append((np.ascontiguousarray(weight.reshape(conv.channels, -1).T), bias, conv))
            channels = conv.channels
        self.size = math.prod(conv_output(layout, self.convs))

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """[N, obs_size] float32 features → [N, size], channel-major as torch flattens."""
        x = features.reshape(len(features), *self.layout.shape)
        if not self.layout.channels_last:
            x = x.transpose(0, 2, 3, 1)
        if self.layout.scale != 1.0:
            x = x * np.float32(self.layout.scale)
        for weight, bias, conv in self.layers:
            windows = np.lib.stride_tricks.sliding_window_view(x, (conv.kernel, conv.kernel), axis=(1, 2))
            windows = windows[:, :: conv.stride, :: conv.stride]  # [N, H', W', C, k, k]
            columns = windows.reshape(*windows.shape[:3], -1)  # a copy: the im2col matrix
            x = np.maximum(columns @ weight + bias, 0)  # [N, H', W', out]
        return x.transpose(0, 3, 1, 2).reshape(len(x), -1)
