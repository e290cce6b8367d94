"""The hand-written forward and backward of `stacked_mlp` and `stacked_towers` against autograd's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import torch
from torch import Tensor

from rlmq.learners import stacked_mlp as stacked
from rlmq.learners.stacked_mlp import (
    Activation,
    Activations,
    CpuMatmul,
    Tower,
    stacked_mlp,
    stacked_towers,
    tanh_into,
)

P, N, SIZES = 3, 7, [4, 6, 5, 2]  # members, samples, layer widths


def parameters(dtype: torch.dtype) -> tuple[list[Tensor], list[Tensor]]:
    g = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(P, out, inp, generator=g, dtype=dtype) for inp, out in zip(SIZES[:-1], SIZES[1:], strict=True)
    ]
    biases = [torch.randn(P, out, generator=g, dtype=dtype) for out in SIZES[1:]]
    return [w.requires_grad_() for w in weights], [b.requires_grad_() for b in biases]


MIXED = ("relu", "tanh", "elu")  # "mixed": member m's activation is MIXED[m], by codes [0, 1, 2]
FUNCTIONS = {"tanh": torch.tanh, "relu": torch.relu, "elu": torch.nn.functional.elu}


def reference(x: Tensor, weights: list[Tensor], biases: list[Tensor], activation: str) -> Tensor:
    """The same network in plain autograd ops, member by member for "mixed"."""
    for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
        x = x @ w.transpose(1, 2) + b.unsqueeze(1)
        if i < len(weights) - 1:
            kinds = MIXED if activation == "mixed" else (activation,) * P
            x = torch.stack([FUNCTIONS[kind](x[m]) for m, kind in enumerate(kinds)])
    return x


def activations(activation: str) -> Activations:
    """What `stacked_mlp` takes for the test's name: the codes [P] for "mixed"."""
    return torch.arange(P) if activation == "mixed" else cast(Activation, activation)


@pytest.fixture(autouse=True)
def hand_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """These shapes are small: take the hand-written path anyway (the autograd one is for small
    batches, `HAND_WRITTEN_MIN_ROWS`)."""
    monkeypatch.setattr(stacked, "HAND_WRITTEN_MIN_ROWS", 0)


@pytest.fixture(params=["numpy", "torch"])
def cpu_matmul(request: pytest.FixtureRequest) -> Iterator[CpuMatmul]:
    """Both libraries `bmm` can run the CPU's matmuls in (NumPy for every size, here)."""
    stacked.use_cpu_matmul(request.param, min_macs=0)
    yield request.param
    stacked.use_cpu_matmul("numpy")


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "mixed"])
@pytest.mark.parametrize("outputs_first", [False, True])
@pytest.mark.parametrize("input_grad", [False, True])
def test_forward_and_every_gradient_match_autograd(
    activation: str, outputs_first: bool, input_grad: bool, cpu_matmul: CpuMatmul
) -> None:
    weights, biases = parameters(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x.requires_grad_(input_grad)
    upstream = torch.randn(P, N, SIZES[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    ours = stacked_mlp(x, weights, biases, activations(activation), outputs_first=outputs_first)
    want = reference(x, weights, biases, activation)
    torch.testing.assert_close(ours, want.transpose(1, 2) if outputs_first else want)

    inputs = [*weights, *biases] + ([x] if input_grad else [])
    got = torch.autograd.grad(ours, inputs, upstream.transpose(1, 2) if outputs_first else upstream)
    expected = torch.autograd.grad(want, inputs, upstream)
    names = [f"w{i}" for i in range(3)] + [f"b{i}" for i in range(3)] + (["x"] if input_grad else [])
    for name, g, e in zip(names, got, expected, strict=True):
        torch.testing.assert_close(g, e, msg=lambda m, name=name: f"{name}: {m}")


def test_only_the_gradients_asked_for_are_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Autograd drops a gradient returned for an input that needs none, so the matmuls of the
    backward are counted: with the first layer's weight frozen and no input gradient, the first
    layer takes none (a backward that computed everything would take 6)."""
    weights, biases = parameters(torch.float32)
    weights[0].requires_grad_(False)
    x = torch.randn(P, N, SIZES[0])
    out = stacked_mlp(x, weights, biases, "tanh")
    calls = []
    real_bmm = stacked.bmm
    monkeypatch.setattr(stacked, "bmm", lambda a, b: calls.append(a.shape) or real_bmm(a, b))
    out.sum().backward()
    assert len(calls) == 4, calls  # layers 2 and 1: a weight gradient and the gradient below each
    assert weights[0].grad is None and x.grad is None
    assert all(t.grad is not None for t in [*weights[1:], *biases])


def test_a_second_derivative_is_refused_not_dropped() -> None:
    weights, biases = parameters(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(stacked_mlp(x, weights, biases, "tanh").sum(), x, create_graph=True)


def test_float32_matches_float64(cpu_matmul: CpuMatmul) -> None:
    """The learners' dtype, on the path each library takes for it."""
    weights, biases = parameters(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64)
    want = stacked_mlp(x, weights, biases, "tanh", outputs_first=True)
    want_grads = torch.autograd.grad(want.sum(), [*weights, *biases])
    single = [t.detach().float().requires_grad_() for t in (*weights, *biases)]
    got = stacked_mlp(x.float(), single[:3], single[3:], "tanh", outputs_first=True)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    for g, w in zip(torch.autograd.grad(got.sum(), single), want_grads, strict=True):
        torch.testing.assert_close(g, w.float(), rtol=1e-4, atol=1e-5)


def test_bmm_takes_expanded_and_transposed_operands(cpu_matmul: CpuMatmul) -> None:
    a = torch.randn(P, 1, 5).expand(P, N, 5)  # stride 0, as the gradient of a sum
    b = torch.randn(P, 6, 5).transpose(1, 2)
    torch.testing.assert_close(stacked.bmm(a, b), torch.bmm(a, b))
    bias = torch.randn(P, 1, 6)
    torch.testing.assert_close(stacked.baddbmm(bias, a, b), torch.baddbmm(bias, a, b))


@pytest.mark.parametrize("activation", ["tanh", "mixed"])
def test_gradcheck_in_float64(activation: str) -> None:
    weights, biases = parameters(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *t: stacked_mlp(t[0], t[1:4], t[4:], activations(activation), outputs_first=True),
        (x, *weights, *biases),
    )


def two_towers_in_one_flat(dtype: torch.dtype) -> tuple[Tensor, tuple[Tower, ...], list[Tensor]]:
    """A [P, D] parameter holding two towers on one input (SIZES, and 4 → 6 → 1) and, between
    them, 3 numbers no tower reads; with each tower's weights and biases as plain tensors."""
    sizes = ([4, 6, 5, 2], [4, 6, 1])
    g = torch.Generator().manual_seed(3)
    columns, towers, plain, offset = [], [], [], 0
    for t, widths in enumerate(sizes):
        linears, weights, biases = [], [], []
        for inp, out in zip(widths[:-1], widths[1:], strict=True):
            weight, bias = (
                torch.randn(P, out, inp, generator=g, dtype=dtype),
                torch.randn(P, out, generator=g, dtype=dtype),
            )
            linears.append((offset, out, inp, offset + out * inp))
            columns += [weight.reshape(P, -1), bias]
            offset += out * inp + out
            weights.append(weight)
            biases.append(bias)
        towers.append(Tower(tuple(linears), "tanh", outputs_first=t == 1))
        plain += [*weights, *biases]
        if t == 0:
            columns.append(torch.randn(P, 3, generator=g, dtype=dtype))  # e.g. a Gaussian's log-std
            offset += 3
    return torch.cat(columns, dim=1), tuple(towers), plain


@pytest.mark.parametrize("input_grad", [False, True])
def test_towers_match_a_stacked_mlp_each(input_grad: bool, cpu_matmul: CpuMatmul) -> None:
    flat, towers, plain = two_towers_in_one_flat(torch.float64)
    flat.requires_grad_()
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x.requires_grad_(input_grad)
    policy, value = stacked_towers(x, flat, towers)
    separate = [t.clone().requires_grad_() for t in plain]  # the same numbers, as tensors of their own
    want_policy = stacked_mlp(x, separate[:3], separate[3:6], "tanh")
    want_value = stacked_mlp(x, separate[6:8], separate[8:], "tanh", outputs_first=True)
    torch.testing.assert_close(policy, want_policy)
    torch.testing.assert_close(value, want_value)

    g = torch.Generator().manual_seed(5)
    up_policy, up_value = (
        torch.randn(policy.shape, generator=g, dtype=torch.float64),
        torch.randn(value.shape, generator=g, dtype=torch.float64),
    )
    loss = (policy * up_policy).sum() + (value * up_value).sum()
    want_loss = (want_policy * up_policy).sum() + (want_value * up_value).sum()
    got = torch.autograd.grad(loss, [flat, x] if input_grad else [flat])
    want = torch.autograd.grad(want_loss, [*separate, x] if input_grad else separate)
    flat_grad = got[0]
    for tower, wanted in zip(towers, (want[:6], want[6:10]), strict=True):
        layers = len(tower.linears)
        for got_part, want_part in zip(
            tower.weights(flat_grad) + tower.biases(flat_grad), wanted[: 2 * layers], strict=True
        ):
            torch.testing.assert_close(got_part, want_part)
    unread = towers[0].linears[-1][3] + towers[0].linears[-1][1]  # just after the first tower's last bias
    assert torch.equal(flat_grad[:, unread : unread + 3], torch.zeros(P, 3, dtype=torch.float64))
    if input_grad:
        torch.testing.assert_close(got[1], want[-1])  # the sum of both towers' input gradients


def test_towers_that_share_a_tensor_add_their_gradients() -> None:
    flat, towers, _ = two_towers_in_one_flat(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64)
    one = torch.autograd.grad(stacked_towers(x, flat.requires_grad_(), towers[:1])[0].sum(), flat)[0]
    twice = torch.autograd.grad(sum(out.sum() for out in stacked_towers(x, flat, towers[:1] * 2)), flat)[0]
    torch.testing.assert_close(twice, 2 * one)


def test_towers_gradcheck_in_float64() -> None:
    flat, towers, _ = two_towers_in_one_flat(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, f: stacked_towers(x, f, towers), (x, flat.requires_grad_()))
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(stacked_towers(x, flat, towers)[1].sum(), flat, create_graph=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_into_is_tanh_in_place_and_out_of_place(dtype: torch.dtype) -> None:
    x = torch.linspace(-12, 12, 1001, dtype=dtype)
    want = torch.tanh(x)
    torch.testing.assert_close(tanh_into(x, torch.empty_like(x)), want, atol=2e-7, rtol=0)
    strided = x.clone()[::2]  # not contiguous: torch's own tanh
    torch.testing.assert_close(tanh_into(strided, torch.empty_like(strided)), want[::2], atol=2e-7, rtol=0)
    assert tanh_into(x, x) is x
    torch.testing.assert_close(x, want, atol=2e-7, rtol=0)


@pytest.mark.parametrize("outputs_first", [False, True])
def test_small_relu_batches_take_autograd_and_agree(monkeypatch: pytest.MonkeyPatch, outputs_first: bool) -> None:
    weights, biases = parameters(torch.float64)
    x = torch.randn(P, N, SIZES[0], dtype=torch.float64)
    hand = stacked_mlp(x, weights, biases, "relu", outputs_first=outputs_first)
    monkeypatch.setattr(stacked, "HAND_WRITTEN_MIN_ROWS", P * N + 1)
    plain = stacked_mlp(x, weights, biases, "relu", outputs_first=outputs_first)
    tanh = stacked_mlp(x, weights, biases, "tanh", outputs_first=outputs_first)
    assert hand.grad_fn is not None and "_StackedMLP" in type(hand.grad_fn).__name__
    assert "_StackedMLP" not in type(plain.grad_fn).__name__
    assert "_StackedMLP" in type(tanh.grad_fn).__name__, "tanh networks take the hand-written path at any size"
    torch.testing.assert_close(plain, hand)
    for g, h in zip(torch.autograd.grad(plain.sum(), weights), torch.autograd.grad(hand.sum(), weights), strict=True):
        torch.testing.assert_close(g, h)


def test_mismatched_layers_are_refused() -> None:
    weights, biases = parameters(torch.float32)
    with pytest.raises(ValueError, match="one of each per layer"):
        stacked_mlp(torch.zeros(P, N, SIZES[0]), weights, biases[:-1], "relu")
