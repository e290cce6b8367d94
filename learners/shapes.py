"""Members of different network shapes in one stacked network: each member's hidden activation,
widths and depth, as PBT mutates them (AgileRL's activation, node and layer mutations;
common/architecture.py). The activations are a select per candidate in `stacked_mlp`; the widths
and the depth are here.

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

Depth works the same way: every member is allocated the deepest MLP (`PBTConfig.max_layers`
hidden layers, all of one width), and a hidden layer of width 0 is absent: `stacked_mlp` passes
its input through for that member (`layer_passes`, a select per layer, the one cost in the update)
and the output layer reads the last layer present. Absent layers are the last ones, so the pass
is always from a layer as wide as the allocation. A layer added starts as the identity on the
units below it (Net2Net's deeper network: the same function for ReLU members, whose hidden
outputs are ≥ 0; not quite for tanh and ELU ones), and one removed is zeroed like a narrowed one.

Members publish their weights trimmed to their widths and depth (`trimmed`), so actors run the
narrow, shallow network; a learner reads such weights back into the allocation (`padded`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from rlmq.common.architecture import layers_present, member_widths
from rlmq.learners.stacked_mlp import Passes

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


def layer_passes(widths: Tensor) -> Passes | None:
    """`stacked_mlp`'s passes for widths [P, L]: per hidden layer, the members without it (width 0),
    or None where every member has it; None where every member has every layer."""
    absent = widths == 0
    if not absent.any():
        return None
    return tuple(absent[:, i].view(-1, 1, 1) if absent[:, i].any() else None for i in range(widths.shape[1]))


def mask(layout: Layout, widths: Tensor, size: int) -> Tensor:
    """[P, size] bool: each member's parameters in use for its widths [P, L] (0: no layer)."""
    population = widths.shape[0]
    keep = torch.ones(population, size, dtype=torch.bool, device=widths.device)
    depths = (widths > 0).sum(1, keepdim=True)  # absent layers are the last ones (architecture.py)
    last = widths.gather(1, (depths - 1).clamp(min=0))  # [P, 1]: the units the output layer reads
    for layers in mlps(layout):
        _check(layers, widths[0])
        for i, (weight, bias) in enumerate(layers):
            (w, (rows, cols)), (b, _) = layout[weight], layout[bias]
            matrix = keep[:, w : w + rows * cols].view(population, rows, cols)
            if i < len(layers) - 1:  # a hidden layer's units beyond the member's width
                unused = torch.arange(rows, device=widths.device) >= widths[:, i : i + 1]  # [P, rows]
                matrix.masked_fill_(unused.unsqueeze(2), False)
                keep[:, b : b + rows].masked_fill_(unused, False)
            if i > 0:  # inputs from the unused units of the layer below (of the last one present)
                below = last if i == len(layers) - 1 else widths[:, i - 1 : i]
                unused = torch.arange(cols, device=widths.device) >= below  # [P, cols]
                matrix.masked_fill_(unused.unsqueeze(1), False)
    return keep


@torch.no_grad()
def grow(flat: Tensor, layout: Layout, member: int, before: Sequence[int], after: Sequence[int], seed: int) -> None:
    """Start the units `member` gains from `before` to `after` widths: their incoming weights drawn
    as a fresh nn.Linear's (uniform in ±1/√fan-in, fan-in the inputs in use), seeded so that every
    rank draws the same; their biases and outgoing weights zero, as the mask left them. A layer
    added (width 0 before) starts as the identity on the units of the layer below, its other units
    drawn so."""
    generator = torch.Generator().manual_seed(seed)
    for layers in mlps(layout):
        _check(layers, after)
        for i, (weight, _) in enumerate(layers[:-1]):
            if after[i] <= before[i]:
                continue
            offset, (rows, cols) = layout[weight]
            fan_in = cols if i == 0 else after[i - 1]
            matrix = flat[member, offset : offset + rows * cols].view(rows, cols)
            start = before[i]
            if start == 0 and i > 0:  # a new layer: h ↦ act(h), which is h for ReLU's h ≥ 0
                start = min(after[i], fan_in)
                matrix[:start, :start] = torch.eye(start, dtype=flat.dtype, device=flat.device)
            if after[i] > start:
                bound = 1 / math.sqrt(fan_in)
                drawn = torch.empty(after[i] - start, fan_in).uniform_(-bound, bound, generator=generator)
                matrix[start : after[i], :fan_in] = drawn.to(flat.device, flat.dtype)


def trimmed(params: dict[str, np.ndarray], layout: Layout, widths: Sequence[int]) -> dict[str, np.ndarray]:
    """A member's parameters cut to its widths and depth: what its actors run. Each MLP keeps its
    layers present, its output layer named as the next Linear after them."""
    in_mlps = {name for layers in mlps(layout) for pair in layers for name in pair}
    out = {name: value for name, value in params.items() if name not in in_mlps}
    present = layers_present(widths)
    for layers in mlps(layout):
        _check(layers, widths)
        kept = [*layers[:present], layers[-1]]
        for i, ((weight, bias), (to_weight, to_bias)) in enumerate(zip(kept, layers, strict=False)):
            rows = widths[i] if i < present else None
            cols = widths[i - 1] if i > 0 else None
            out[to_weight] = np.ascontiguousarray(params[weight][:rows, :cols])
            out[to_bias] = np.ascontiguousarray(params[bias][:rows])
    return out


def padded(params: Mapping[str, np.ndarray], layout: Layout) -> dict[str, np.ndarray]:
    """A member's trimmed parameters (`trimmed`) back in the allocation: each MLP's layers where
    they were, its last one as the output layer, zeros beyond and for the layers it lacks.
    ValueError for an MLP parameter wider than its allocation; the others are left as they are,
    for the caller to check."""
    out = dict(params)
    for layers in mlps(layout):
        present = sum(1 for weight, _ in layers if weight in params)
        if not 1 <= present <= len(layers):
            continue  # not this network's: the caller names what is missing
        kept = [*layers[: present - 1], layers[-1]]
        for (weight, bias), (from_weight, from_bias) in zip(kept, layers, strict=False):
            for name, source in ((weight, from_weight), (bias, from_bias)):
                value, shape = out.pop(source), layout[name][1]
                if value.ndim != len(shape) or any(v > s for v, s in zip(value.shape, shape, strict=True)):
                    raise ValueError(f"{source}: {tuple(value.shape)}, the network has {tuple(shape)} at {name}")
                wide = np.zeros(tuple(shape), np.float32)
                wide[tuple(slice(0, v) for v in value.shape)] = value
                out[name] = wide
        for weight, bias in layers[present - 1 : -1]:
            for name in (weight, bias):
                out[name] = np.zeros(tuple(layout[name][1]), np.float32)
    return out
