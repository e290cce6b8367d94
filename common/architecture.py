"""A member's network shape as hyperparameters that PBT mutates (AgileRL's architecture
mutations), so that it travels where the others do: member records, the decisions' log, the
learners' PBT state and checkpoints, policy files.

    activation  its hidden activation, as the code of ACTIVATIONS (`PBTConfig.activations`)
    width.{i}   the units hidden layer i uses, of the width every member is allocated
                (`PBTConfig.max_width`): a prefix of the layer, the rest masked to zero;
                0 where the member lacks the layer (of the `PBTConfig.max_layers` allocated):
                only after the last layer it has, and never the first

docs/architecture.md, "Population methods beyond PBT", says how one update runs members of
different shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# The networks' hidden activations, in the order of their codes.
ACTIVATIONS = ("relu", "tanh", "elu")
MAX_WIDTH = 65_536
MAX_LAYERS = 16  # hidden layers a member may be allocated (`PBTConfig.max_layers`)
_WIDTH = re.compile(r"width\.(\d+)")


def activation_code(name: str) -> float:
    """The "activation" hyperparameter's value for the activation `name`."""
    return float(ACTIVATIONS.index(name))


def activation_named(code: float) -> str:
    """The activation of an "activation" hyperparameter's value; ValueError for no code."""
    if code not in range(len(ACTIVATIONS)):
        raise ValueError(f"activation code {code:g} is none of 0 … {len(ACTIVATIONS) - 1} ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[int(code)]


def member_activation(hyperparams: Mapping[str, float]) -> str:
    """A member's hidden activation where PBT mutates it, else "" (the run config's): as
    `wire.Weights.activation` carries it."""
    return activation_named(hyperparams["activation"]) if "activation" in hyperparams else ""


def width_name(layer: int) -> str:
    return f"width.{layer}"


def member_widths(hyperparams: Mapping[str, float]) -> tuple[int, ...] | None:
    """The units each hidden layer of a member uses where PBT mutates widths, else None."""
    layers = sorted(int(m[1]) for name in hyperparams if (m := _WIDTH.fullmatch(name)))
    return tuple(int(hyperparams[width_name(i)]) for i in layers) if layers else None


def layers_present(widths: Sequence[int]) -> int:
    """The hidden layers a member has: those before its first of width 0."""
    return next((i for i, w in enumerate(widths) if w == 0), len(widths))


def layers_problems(hyperparams: Mapping[str, float]) -> list[str]:
    """What is wrong with a member's layers as a whole: it must have the first, and none after
    one it lacks."""
    widths = member_widths(hyperparams)
    if widths is None:
        return []
    present = layers_present(widths)
    if present == 0 or any(widths[present:]):
        return [f"widths {list(widths)}: a member has its first layer, and none after one of width 0"]
    return []


def member_shape(hyperparams: Mapping[str, float]) -> dict[str, float]:
    """The hyperparameters that shape a member's network (none where PBT mutates no shape)."""
    return {name: value for name, value in hyperparams.items() if is_shape_hyperparam(name)}


def is_shape_hyperparam(name: str) -> bool:
    return name == "activation" or _WIDTH.fullmatch(name) is not None


def shape_problems(name: str, value: float) -> list[str]:
    """What is wrong with a shape hyperparameter's value: a code of ACTIVATIONS, or a whole
    number of units (0: no layer)."""
    if name == "activation" and value not in range(len(ACTIVATIONS)):
        return [f"activation = {value:g} is no code of {', '.join(ACTIVATIONS)}"]
    if name != "activation" and (value != int(value) or not 0 <= value <= MAX_WIDTH):
        return [f"{name} = {value:g} is no number of units in [0, {MAX_WIDTH}]"]
    return []
