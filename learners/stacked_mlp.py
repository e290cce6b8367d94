"""P MLPs of one shape run as batched matmuls over the member axis, with the backward written by hand.

On one CPU thread the population's forward and backward are a few dozen batched ops on
[P, N, 64] tensors, and autograd's bookkeeping around them (a node, saved tensors and a grad
buffer per op) is a large share of the time. One `autograd.Function` for the whole MLP does
the same arithmetic with none of that: activations applied in place, each weight gradient taken
in the layout that suits the matmul kernel (`_weight_grad`). Small ReLU batches, where its fixed
Python cost outweighs that, take plain autograd ops (`HAND_WRITTEN_MIN_ROWS`). `stacked_towers`
runs several MLPs that read one flat [P, D] parameter (an actor-critic's two) as one Function,
whose backward writes that parameter's gradient whole.

On the CPU the larger matmuls go through NumPy (`bmm`). torch's MKL takes its AVX2 code path on AMD
CPUs; NumPy's OpenBLAS picks its AVX-512 kernels where the CPU has them, which run a population's
products about twice as fast (benchmarks/LOG.md §4).
Tested against autograd (`tests/test_stacked_mlp.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

Activation = Literal["tanh", "relu", "elu"]
# A network's hidden activation: one for every member, or each member's own as codes [P] into
# `common.algorithms.ACTIVATIONS` (relu 0, tanh 1, elu 2: PBT's activation mutation), applied by a
# select per candidate. Each candidate's derivative comes from its output, so the hand-written
# backward takes them all: ReLU's 1[y > 0], tanh's 1 − y², ELU's y + 1 below 0.
Activations = Activation | Tensor
# Per hidden layer, the members for which it is absent and passes its input through (PBT's layer
# mutation: a member shallower than the allocation), as bool [P, 1, 1], or None where no member's is.
Passes = Sequence[Tensor | None]
CpuMatmul = Literal["numpy", "torch"]
_NUMPY_FLOATS = (torch.float32, torch.float64)

# Below this many rows (members × samples) a ReLU network's hand-written backward costs more in
# Python than it saves: one member's TD3 or SAC step (256 samples) is slower through it. A tanh
# network always takes it: its autograd path runs tanh as a Python Function too (`_Tanh`), so by
# hand is the faster way even for one member's PPO update (benchmarks/LOG.md §4).
HAND_WRITTEN_MIN_ROWS = 1024
# Below this many multiply-adds NumPy's extra per-call cost outweighs its faster kernels: a single
# member's MLP is slower through NumPy, eight members' faster (benchmarks/LOG.md §4).
NUMPY_MIN_MACS = 1 << 21


def traced() -> bool:
    """Whether torch.compile is tracing the caller (learners/capture.py). Then plain autograd ops,
    which the compiler fuses, stand in for the hand-written Functions and NumPy calls, which are
    for eager execution."""
    return torch.compiler.is_compiling()


def stacked_mlp(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    activation: Activations,
    *,
    outputs_first: bool = False,
    passes: Passes | None = None,
) -> Tensor:
    """[P, N, in] → [P, N, out] through Linears `weights[i]` [P, out, in] and `biases[i]` [P, out],
    `activation` between them (not after the last). `outputs_first`: return [P, out, N] instead,
    the faster layout for a narrow last layer and for a softmax over its outputs. `passes`: the
    hidden layers absent for some members, whose output is then their input (`Passes`)."""
    if len(weights) != len(biases) or not weights:
        raise ValueError(f"{len(weights)} weights and {len(biases)} biases: one of each per layer")
    if passes is not None and len(passes) != len(weights) - 1:
        raise ValueError(f"{len(passes)} layers' passes for {len(weights) - 1} hidden layers")
    small = x.shape[0] * x.shape[1] < HAND_WRITTEN_MIN_ROWS
    if traced() or (isinstance(activation, str) and activation != "tanh" and small):
        return _autograd_mlp(x, weights, biases, activation, outputs_first, passes)
    out: Tensor = _StackedMLP.apply(x, activation, outputs_first, passes, *weights, *biases)
    return out


def _autograd_mlp(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    activation: Activations,
    outputs_first: bool,
    passes: Passes | None = None,
) -> Tensor:
    """The network in plain autograd ops: a small ReLU or ELU one (under `HAND_WRITTEN_MIN_ROWS`),
    or any while `traced`."""
    for i, (weight, bias) in enumerate(zip(weights[:-1], biases[:-1], strict=True)):
        h = _activate(torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2)), activation)
        passing = None if passes is None else passes[i]
        x = h if passing is None else torch.where(passing, x, h)
    if outputs_first:
        return torch.baddbmm(biases[-1].unsqueeze(2), weights[-1], x.transpose(1, 2))
    return torch.baddbmm(biases[-1].unsqueeze(1), x, weights[-1].transpose(1, 2))


class _Tanh(torch.autograd.Function):
    """tanh through `tanh_into` (NumPy's on the CPU); the backward is tanh's own, from the output."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = tanh_into(x, torch.empty_like(x, memory_format=torch.contiguous_format))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def fast_tanh(x: Tensor) -> Tensor:
    """tanh with autograd; on the CPU through NumPy (see `tanh_into`)."""
    return torch.tanh(x) if x.is_cuda or traced() else _Tanh.apply(x)


def tanh_into(x: Tensor, out: Tensor) -> Tensor:
    """out = tanh(x), `out` may be `x`; no autograd. On the CPU through NumPy: torch's CPU tanh is
    many times slower than NumPy's, which is also nearer the exact value, and slower than 2σ(2x) − 1
    in torch ops too (benchmarks/LOG.md §4)."""
    if x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS and x.is_contiguous() and out.is_contiguous():
        np.tanh(x.detach().numpy(), out=out.detach().numpy())
        return out
    return torch.tanh(x.detach(), out=out)


_cpu_matmul: CpuMatmul = "numpy"
_numpy_min_macs = NUMPY_MIN_MACS


def use_cpu_matmul(backend: CpuMatmul, min_macs: int = NUMPY_MIN_MACS) -> None:
    """Which library runs `bmm` on the CPU, process-wide: NumPy for products of at least
    `min_macs` multiply-adds, or always torch ("torch": its MKL, to compare)."""
    global _cpu_matmul, _numpy_min_macs
    _cpu_matmul, _numpy_min_macs = backend, min_macs


def _in_numpy(a: Tensor, b: Tensor) -> bool:
    return (
        _cpu_matmul == "numpy"
        and a.device.type == "cpu"
        and a.dtype in _NUMPY_FLOATS
        and b.dtype == a.dtype
        and a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2] >= _numpy_min_macs
    )


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """torch.bmm, through NumPy on the CPU (see the module's docstring); no autograd."""
    return _numpy_bmm(a, b) if _in_numpy(a, b) else torch.bmm(a, b)


def baddbmm(bias: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """bias + a @ b, bias broadcast, as torch.baddbmm; no autograd."""
    return _numpy_bmm(a, b).add_(bias) if _in_numpy(a, b) else torch.baddbmm(bias, a, b)


def _numpy_bmm(a: Tensor, b: Tensor) -> Tensor:
    # An expanded operand (a stride of 0) would send NumPy to its slow loop instead of BLAS.
    a, b = (t.contiguous() if 0 in t.stride() else t for t in (a, b))
    return torch.from_numpy(np.matmul(a.detach().numpy(), b.detach().numpy()))


def _activate(z: Tensor, activation: Activations) -> Tensor:
    """The activation in autograd ops; each member's own for codes [P] (`Activations`)."""
    if isinstance(activation, Tensor):
        code = activation.view(-1, 1, 1)
        return torch.where(code == 0, z.relu(), torch.where(code == 1, torch.tanh(z), F.elu(z)))
    return {"relu": torch.relu, "tanh": torch.tanh, "elu": F.elu}[activation](z)


def _activate_(z: Tensor, activation: Activations) -> Tensor:
    """The activation on a matmul's fresh output, in place where it has one kind."""
    if isinstance(activation, Tensor):
        return _activate(z, activation)
    if activation == "elu":
        return F.elu_(z)
    return z.relu_() if activation == "relu" else tanh_into(z, z)


def _activation_backward(grad: Tensor, output: Tensor, activation: Activations) -> Tensor:
    """The gradient at the activation's input, from the gradient at its output and that output."""
    if isinstance(activation, Tensor):
        code = activation.view(-1, 1, 1)
        below = torch.where(code == 2, output + 1, torch.zeros_like(output))  # ELU's e^x, ReLU's 0
        return grad * torch.where(code == 1, 1 - output * output, torch.where(output > 0, 1.0, below))
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, output, 0)
    if activation == "elu":
        return grad * torch.where(output > 0, 1.0, output + 1)
    return torch.ops.aten.tanh_backward(grad, output)


def refuse_second_derivative(name: str) -> None:
    """A hand-written backward is not itself differentiable: under `create_graph=True` (the only
    time grad mode is on in a backward) say so, rather than hand back a gradient without a graph."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{name} has no second derivative (its backward is written by hand): "
            "use plain autograd ops where create_graph=True is needed"
        )


def _weight_grad(grad: Tensor, inputs: Tensor) -> Tensor:
    """∂L/∂W [P, out, in] = gradᵀ·inputs. The batched matmul kernel is several times slower when
    its output's last dimension is narrow (a 4-wide observation; benchmarks/LOG.md §4), so the
    product is taken with the wider dimension last, and transposed as a view."""
    if inputs.shape[-1] < grad.shape[-1]:
        return bmm(inputs.transpose(1, 2), grad).transpose(1, 2)
    return bmm(grad.transpose(1, 2), inputs)


def _mlp_forward(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    activation: Activations,
    outputs_first: bool,
    passes: Passes | None,
) -> tuple[Tensor, list[Tensor]]:
    """(output, each hidden layer's output): tanh′ and ReLU′ come from the output, and each hidden
    output is the next weight's input."""
    hidden: list[Tensor] = []
    h = x
    for i, (weight, bias) in enumerate(zip(weights[:-1], biases[:-1], strict=True)):
        out = _activate_(baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2)), activation)
        passing = None if passes is None else passes[i]
        h = out if passing is None else torch.where(passing, h, out)
        hidden.append(h)
    if outputs_first:
        return baddbmm(biases[-1].unsqueeze(2), weights[-1], h.transpose(1, 2)), hidden
    return baddbmm(biases[-1].unsqueeze(1), h, weights[-1].transpose(1, 2)), hidden


def _mlp_backward(
    grad: Tensor,
    inputs: Sequence[Tensor],
    weights: Sequence[Tensor],
    activation: Activations,
    outputs_first: bool,
    passes: Passes | None,
    needs: Sequence[bool],
    needs_x: bool,
) -> tuple[list[Tensor | None], Tensor | None]:
    """Walk the layers in reverse from `grad` at the output: ([∂W₀, …, ∂b₀, …], ∂x), computing
    only the gradients `needs` (weights', then biases') and `needs_x` ask for. Where a hidden layer
    passes its input through, the gradient at its output goes to its input, and none to its Linear."""
    layers = len(weights)
    grads: list[Tensor | None] = [None] * (2 * layers)
    passed: Tensor | None = None  # the gradient a passing layer hands to its input, as it was at its output
    # `grad`: at layer i's Linear's output, [P, N, out] ([P, out, N] if outputs_first)
    for i in reversed(range(layers)):
        last_first = outputs_first and i == layers - 1
        if needs[i]:
            grads[i] = bmm(grad, inputs[i]) if last_first else _weight_grad(grad, inputs[i])
        if needs[layers + i]:
            grads[layers + i] = grad.sum(2 if last_first else 1)
        if i == 0 and not needs_x:
            return grads, None
        grad = bmm(grad.transpose(1, 2) if last_first else grad, weights[i])  # at its input
        if passed is not None:
            grad = grad + passed
        if i > 0:
            passing = None if passes is None else passes[i - 1]
            local = _activation_backward(grad, inputs[i], activation)
            passed = None if passing is None else torch.where(passing, grad, 0.0)
            grad = local if passing is None else torch.where(passing, 0.0, local)
    return grads, grad


class _StackedMLP(torch.autograd.Function):
    """One MLP, its weights and biases given as tensors of their own."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, activation: Activations, outputs_first: bool, passes: Passes | None, *params: Tensor
    ) -> Tensor:
        layers = len(params) // 2
        out, hidden = _mlp_forward(x, params[:layers], params[layers:], activation, outputs_first, passes)
        ctx.activation, ctx.outputs_first, ctx.passes = activation, outputs_first, passes
        ctx.save_for_backward(x, *params[:layers], *hidden)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        refuse_second_derivative("stacked_mlp")
        x, *saved = ctx.saved_tensors
        layers = (len(saved) + 1) // 2
        grads, x_grad = _mlp_backward(
            grad,
            [x, *saved[layers:]],
            saved[:layers],
            ctx.activation,
            ctx.outputs_first,
            ctx.passes,
            ctx.needs_input_grad[4:],
            ctx.needs_input_grad[0],
        )
        return (x_grad, None, None, None, *grads)


class Tower(NamedTuple):
    """One MLP whose parameters lie in a flat [P, D] parameter: for each Linear, (offset of its
    weight [out, in] in a row, out, in, offset of its bias [out])."""

    linears: tuple[tuple[int, int, int, int], ...]
    activation: Activations
    outputs_first: bool
    passes: Passes | None = None

    def weights(self, flat: Tensor) -> list[Tensor]:
        return [flat[:, w : w + o * i].view(-1, o, i) for w, o, i, _b in self.linears]

    def biases(self, flat: Tensor) -> list[Tensor]:
        return [flat[:, b : b + o] for _w, o, _i, b in self.linears]


def stacked_towers(x: Tensor, flat: Tensor, towers: Sequence[Tower]) -> tuple[Tensor, ...]:
    """Several MLPs on one input, their parameters read from `flat` [P, D]: one `autograd.Function`
    whose backward writes ∂`flat` whole. Through `stacked_mlp`, an actor-critic's two towers would
    be two Functions plus a view per tensor, and autograd would put ∂`flat` together from a piece
    per tensor, which costs a CartPole member's update a few percent (benchmarks/LOG.md §4).
    Always the hand-written path (its one user is PPO's actor-critic, any activation) while not
    `traced`, whatever `HAND_WRITTEN_MIN_ROWS` says for ReLU networks."""
    if traced():
        return tuple(
            _autograd_mlp(x, t.weights(flat), t.biases(flat), t.activation, t.outputs_first, t.passes) for t in towers
        )
    outs: tuple[Tensor, ...] = _StackedTowers.apply(x, flat, tuple(towers))
    return outs


class _StackedTowers(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, flat: Tensor, towers: tuple[Tower, ...]) -> tuple[Tensor, ...]:
        outs, hidden = [], []
        for tower in towers:
            out, tower_hidden = _mlp_forward(
                x, tower.weights(flat), tower.biases(flat), tower.activation, tower.outputs_first, tower.passes
            )
            outs.append(out)
            hidden += tower_hidden
        ctx.towers = towers
        ctx.save_for_backward(x, flat, *hidden)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        refuse_second_derivative("stacked_towers")
        x, flat, *hidden = ctx.saved_tensors
        needs_x, needs_flat = ctx.needs_input_grad[:2]
        flat_grad = torch.zeros_like(flat) if needs_flat else None  # parameters in no tower get 0
        x_grad = None
        for tower, grad in zip(ctx.towers, grads, strict=True):
            layers = len(tower.linears)
            tower_hidden, hidden = hidden[: layers - 1], hidden[layers - 1 :]
            tower_grads, tower_x_grad = _mlp_backward(
                grad,
                [x, *tower_hidden],
                tower.weights(flat),
                tower.activation,
                tower.outputs_first,
                tower.passes,
                [needs_flat] * (2 * layers),
                needs_x,
            )
            if flat_grad is not None:
                for slot, part in zip(tower.weights(flat_grad) + tower.biases(flat_grad), tower_grads, strict=True):
                    slot.add_(part)  # added, not copied: towers may share a tensor
            if tower_x_grad is not None:
                x_grad = tower_x_grad if x_grad is None else x_grad + tower_x_grad
        return x_grad, flat_grad, None
