"""Members of different network shapes in one stacked network: each member's hidden activation
and widths, as PBT mutates them (AgileRL's activation and node mutations; common/architecture.py).
The activations are a select per candidate in `stacked_mlp`; the widths are here.

Every member is allocated the same, widest layers (`PBTConfig.max_width`), so the population
stays one [P, D] parameter and one batched step. A member uses a prefix of each hidden layer,
`widths[i]` units of layer i; the rest of its weights and biases are zero, in and out. Nothing
masks the update: a unit whose incoming and outgoing weights are zero outputs act(0) = 0 (ReLU,
tanh and ELU alike), so every gradient that touches it is exactly zero, and so are the Adam
moments of those entries once zeroed, and so its step. What a mask has to do is done when the
widths change: shrinking zeroes the units given up (`mask`, with the optimizer's moments), and
growing starts the new units' incoming weights as a fresh Linear's, their outgoing weights at
zero, so the network computes what it did before and the gradient reaches them through the
outgoing ones first (`grow`).

Members publish their weights trimmed to their widths (`trimmed`), so actors run the narrow
network; a learner reads such weights back into the allocation (`padded`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from rlmq.common.architecture import member_widths

if TYPE_CHECKING:
    from rlmq.learners.networks import Stacked
    from rlmq.learners.optim import PopulationAdam

Layout = Mapping[str, tuple[int, torch.Size]]
Layers = list[tuple[str, str]]  # one MLP's (weight, bias) names, input layer first


def set_member_shapes(
    networks: Sequence[Stacked], optimizers: Iterable[PopulationAdam], hyperparams: list[dict[str, float]]
) -> None:
    """Each member's hidden activation and widths, where PBT mutates them (common/architecture.py),
    on every network the members own; the moments `optimizers` keep for parameters a narrower
    member gave up are zeroed with them (the module's docstring says why that is all it takes)."""
    codes = (
        torch.tensor([int(h["activation"]) for h in hyperparams], dtype=torch.long)
        if "activation" in hyperparams[0]
        else None
    )
    each = [member_widths(h) for h in hyperparams]
    widths = None if each[0] is None else torch.tensor(each, dtype=torch.long)
    for network in networks:
        network.set_activations(codes)
        keep = network.set_widths(widths)
        for optimizer in optimizers:
            if keep is not None and optimizer.param is network.flat:
                optimizer.keep_only(keep)


def mlps(layout: Layout) -> list[Layers]:
    """The MLPs (nn.Sequential of Linears, named `prefix.{2i}`) of a member module's layout; the
    encoder's and the recurrent core's layers are not among them."""
    prefixes = sorted(
        {name.split(".")[0] for name, (_, shape) in layout.items() if len(shape) == 2 and name.count(".") == 2}
        - {"encoder"}
    )
    found = []
    for prefix in prefixes:
        layers, i = [], 0
        while f"{prefix}.{i}.weight" in layout:
            layers.append((f"{prefix}.{i}.weight", f"{prefix}.{i}.bias"))
            i += 2
        found.append(layers)
    return found


def _check(layers: Layers, widths: Sequence[int] | Tensor) -> None:
    if len(layers) - 1 != len(widths):
        raise ValueError(f"{layers[0][0].split('.')[0]} has {len(layers) - 1} hidden layers, widths {len(widths)}")


def mask(layout: Layout, widths: Tensor, size: int) -> Tensor:
    """[P, size] bool: each member's parameters in use for its widths [P, L]."""
    population = widths.shape[0]
    keep = torch.ones(population, size, dtype=torch.bool, device=widths.device)
    for layers in mlps(layout):
        _check(layers, widths[0])
        for i, (weight, bias) in enumerate(layers):
            (w, (rows, cols)), (b, _) = layout[weight], layout[bias]
            matrix = keep[:, w : w + rows * cols].view(population, rows, cols)
            if i < len(layers) - 1:  # a hidden layer's units beyond the member's width
                unused = torch.arange(rows, device=widths.device) >= widths[:, i : i + 1]  # [P, rows]
                matrix.masked_fill_(unused.unsqueeze(2), False)
                keep[:, b : b + rows].masked_fill_(unused, False)
            if i > 0:  # inputs from the layer below's unused units
                unused = torch.arange(cols, device=widths.device) >= widths[:, i - 1 : i]  # [P, cols]
                matrix.masked_fill_(unused.unsqueeze(1), False)
    return keep


@torch.no_grad()
def grow(flat: Tensor, layout: Layout, member: int, before: Sequence[int], after: Sequence[int], seed: int) -> None:
    """Start the units `member` gains from `before` to `after`: their incoming weights drawn as a
    fresh nn.Linear's (uniform in ±1/√fan-in, fan-in the inputs in use), seeded so that every rank
    draws the same; their biases and outgoing weights zero, as the mask left them."""
    generator = torch.Generator().manual_seed(seed)
    for layers in mlps(layout):
        _check(layers, after)
        for i, (weight, _) in enumerate(layers[:-1]):
            if after[i] <= before[i]:
                continue
            offset, (rows, cols) = layout[weight]
            fan_in = cols if i == 0 else after[i - 1]
            bound = 1 / math.sqrt(fan_in)
            drawn = torch.empty(after[i] - before[i], fan_in).uniform_(-bound, bound, generator=generator)
            matrix = flat[member, offset : offset + rows * cols].view(rows, cols)
            matrix[before[i] : after[i], :fan_in] = drawn.to(flat.device, flat.dtype)


def trimmed(params: dict[str, np.ndarray], layout: Layout, widths: Sequence[int]) -> dict[str, np.ndarray]:
    """A member's parameters cut to its widths: what its actors run."""
    out = dict(params)
    for layers in mlps(layout):
        _check(layers, widths)
        for i, (weight, bias) in enumerate(layers):
            rows = widths[i] if i < len(layers) - 1 else None
            cols = widths[i - 1] if i > 0 else None
            out[weight] = np.ascontiguousarray(params[weight][:rows, :cols])
            out[bias] = np.ascontiguousarray(params[bias][:rows])
    return out


def padded(name: str, value: np.ndarray, shape: torch.Size, layout: Layout) -> np.ndarray:
    """A trimmed MLP parameter back in its allocated `shape`, zeros beyond; ValueError for any
    other parameter whose shape differs, or one wider than the allocation."""
    in_mlp = any(name in pair for layers in mlps(layout) for pair in layers)
    if not in_mlp or value.ndim != len(shape) or any(v > s for v, s in zip(value.shape, shape, strict=True)):
        raise ValueError(f"{name}: {tuple(value.shape)}, the network has {tuple(shape)}")
    out = np.zeros(tuple(shape), np.float32)
    out[tuple(slice(0, v) for v in value.shape)] = value
    return out
