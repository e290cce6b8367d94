"""Image observations: the convolutional encoders declared once, which one a run's networks put in
front of their heads, and the encoder's forward pass in NumPy, as the actors run it.

An encoder reads an observation as the networks' features give it (`schema.obs_features`: the
observation flattened to float32, normalized if the run normalizes observations), puts it back into
an image [C, H, W], scales bytes to [0, 1] and runs its layers in order; its output, flattened
channel-major as torch's `nn.Flatten` does, feeds the policy, value or Q heads. The layers are
declared once here, as a flat plan of a few kinds (`Layer`) that every forward pass walks: the
actors' in NumPy (`NumpyEncoder`), the learners' in torch for one member or a population
(`rlmq.learners.encoders`) and the exported policy's. The state-dict names ``encoder.{2i}.weight``
/ ``encoder.{2i}.bias`` of the i-th convolution are the contract between them (i counts the
plan's convolutions: a plain stack's names are those of an `nn.Sequential` of Conv2d and ReLU).

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
    """A convolution (output channels, square kernel, stride, zeros padded on each side), then a
    ReLU unless `relu` is False."""

    channels: int
    kernel: int
    stride: int
    padding: int = 0
    relu: bool = True


@dataclass(frozen=True)
class MaxPool:
    """Max over square windows; the padding counts as −∞ (torch's `max_pool2d`)."""

    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class ReLU:
    pass


@dataclass(frozen=True)
class Skip:
    """Remember the activations here for the next `AddSkip` (a residual connection's start)."""


@dataclass(frozen=True)
class AddSkip:
    """Add the activations `Skip` remembered (shapes equal)."""


Layer = Conv | MaxPool | ReLU | Skip | AddSkip


def impala_stage(channels: int) -> tuple[Layer, ...]:
    """One of the IMPALA ResNet's stages (Espeholt et al. 2018, fig. 3): a 3×3 convolution, a 3×3
    max-pool of stride 2 and two residual blocks x + conv(relu(conv(relu(x))))."""
    residual = (Skip(), ReLU(), Conv(channels, 3, 1, 1), Conv(channels, 3, 1, 1, relu=False), AddSkip())
    return Conv(channels, 3, 1, 1, relu=False), MaxPool(3, 2, 1), *residual, *residual


ENCODERS: dict[str, tuple[Layer, ...]] = {
    # Mnih et al. 2015 (the Nature DQN), for 84×84 frames: 3,136 features.
    "nature": (Conv(32, 8, 4), Conv(64, 4, 2), Conv(64, 3, 1)),
    # Young & Tian 2019 (MinAtar's DQN and actor-critic), for 10×10 frames: 1,024 features.
    "minatar": (Conv(16, 3, 1),),
    # IMPALA's ResNet: three stages of 16, 32, 32 channels, then a ReLU; any image size (84×84:
    # 3,872 features, 10×10: 128). Named only (encoder = "impala"), never picked by "auto".
    "impala": (*impala_stage(16), *impala_stage(32), *impala_stage(32), ReLU()),
}
# The encoders whose forward pass actors run in torch (`common/torch_images.py`, imported only
# then): at an actor's batch, torch's convolutions are faster than NumPy's im2col matmuls for these
# and slower for MinAtar's one small convolution (benchmarks/LOG.md §10,
# `bench_encoder_forward.py`).
TORCH_IN_ACTORS = frozenset({"nature", "impala"})
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
    def size(self) -> int:
        """The image's share of the features: the first `size` (a composite observation's other
        parts follow it, and go past the encoder to the heads as they are)."""
        return self.channels * self.height * self.width

    @property
    def shape(self) -> tuple[int, int, int]:
        """The observation's own shape."""
        if self.channels_last:
            return self.height, self.width, self.channels
        return self.channels, self.height, self.width


def image_layout(spec: EnvSpec) -> ImageLayout | None:
    """The layout of a three-dimensional Box observation, or of a composite observation's first
    part if it is one (`encoded_size`); None for anything else."""
    shape, dtype = spec.obs_shape, spec.obs_dtype
    if spec.obs_parts:
        shape, dtype = spec.obs_parts[0].shape, spec.obs_parts[0].dtype
    if len(shape) != 3 or spec.obs_categories:
        return None
    first, _middle, last = shape
    scale = 1 / 255 if dtype == "uint8" else 1.0
    if last < first:  # (10, 10, 4), (84, 84, 3): channels last
        height, width, channels = shape
        return ImageLayout(channels, height, width, True, scale)
    channels, height, width = shape
    return ImageLayout(channels, height, width, False, scale)


def convolutions(layers: tuple[Layer, ...]) -> list[Conv]:
    """The plan's convolutions in order: the i-th holds ``encoder.{2i}.*``."""
    return [layer for layer in layers if isinstance(layer, Conv)]


def conv_output(layout: ImageLayout, layers: tuple[Layer, ...]) -> tuple[int, int, int]:
    """(channels, height, width) after `layers`; a side below 1 means the image is too small."""
    channels, height, width = layout.channels, layout.height, layout.width
    for layer in layers:
        if isinstance(layer, Conv | MaxPool):
            height, width = ((side + 2 * layer.padding - layer.kernel) // layer.stride + 1 for side in (height, width))
        if isinstance(layer, Conv):
            channels = layer.channels
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
        raise ValueError(f'this algorithm\'s networks take flat observations: use encoder = "mlp", not {choice!r}')
    if layout is None:
        raise ValueError(
            f"encoder {choice!r} needs a 3-D Box observation ([C, H, W] or [H, W, C]), "
            f'not shape {spec.obs_shape}: use encoder = "mlp"'
        )
    if min(conv_output(layout, ENCODERS[choice])[1:]) < 1:
        raise ValueError(
            f'encoder {choice!r} does not fit {layout.height}×{layout.width} images: use "minatar" or "mlp"'
        )
    return choice


def encoded_size(spec: EnvSpec, encoder: str) -> int:
    """The width of the heads' input: the encoder's flattened output, or the features themselves."""
    layout = image_layout(spec)
    if encoder == "mlp" or layout is None:
        return spec.obs_size
    return math.prod(conv_output(layout, ENCODERS[encoder])) + spec.obs_size - layout.size


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
        convs = convolutions(ENCODERS.get(encoder, ()))
        if layout is None or encoder not in ENCODERS or len(names) != len(convs):
            raise ValueError(
                f"weights hold {len(names)} encoder convolutions, the run's encoder "
                f"{encoder!r} for observations {spec.obs_shape} needs {len(convs)}"
            )
        self.layout, self.plan = layout, ENCODERS[encoder]
        # (weight [C·k·k, out] in the windows' (C, kh, kw) order, bias [out], the convolution)
        self.convs: list[tuple[np.ndarray, np.ndarray, Conv]] = []
        channels = layout.channels
        for conv, (w, b) in zip(convs, names, strict=True):
            weight, bias = params[w].astype(np.float32), params[b].astype(np.float32)
            if weight.shape != (conv.channels, channels, conv.kernel, conv.kernel) or bias.shape != (conv.channels,):
                raise ValueError(
                    f"{w} is {weight.shape}, the encoder needs {(conv.channels, channels, conv.kernel, conv.kernel)}"
                )
            self.convs.append((np.ascontiguousarray(weight.reshape(conv.channels, -1).T), bias, conv))
            channels = conv.channels
        self.size = math.prod(conv_output(layout, self.plan)) + spec.obs_size - layout.size

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """[N, obs_size] float32 features → [N, size], channel-major as torch flattens; a composite
        observation's other parts appended as they are."""
        rest = features[:, self.layout.size :]
        x = features[:, : self.layout.size].reshape(len(features), *self.layout.shape)
        if not self.layout.channels_last:
            x = x.transpose(0, 2, 3, 1)
        if self.layout.scale != 1.0:
            x = x * np.float32(self.layout.scale)
        convs, skip = iter(self.convs), x
        for layer in self.plan:
            if isinstance(layer, Conv):
                weight, bias, _conv = next(convs)
                x = windows(x, layer.kernel, layer.stride, layer.padding, 0.0)
                x = x.reshape(*x.shape[:3], -1) @ weight + bias  # the reshape copies: the im2col matrix
                if layer.relu:
                    np.maximum(x, 0, out=x)
            elif isinstance(layer, MaxPool):
                x = windows(x, layer.kernel, layer.stride, layer.padding, -np.inf).max(axis=(4, 5))
            elif isinstance(layer, ReLU):
                x = np.maximum(x, 0)  # a new array: a `Skip` may hold the old one
            elif isinstance(layer, Skip):
                skip = x
            else:
                x = x + skip
        encoded = x.transpose(0, 3, 1, 2).reshape(len(x), -1)
        return np.concatenate([encoded, rest], axis=1) if rest.shape[1] else encoded


def windows(x: np.ndarray, kernel: int, stride: int, padding: int, pad_value: float) -> np.ndarray:
    """[N, H, W, C] → every (kernel × kernel) window at `stride`, [N, H', W', C, k, k] (a view
    unless padded)."""
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)), constant_values=pad_value)
    view = np.lib.stride_tricks.sliding_window_view(x, (kernel, kernel), axis=(1, 2))
    return view[:, ::stride, ::stride]
