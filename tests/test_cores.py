"""Recurrent cores: the population's cells in one batched step (learners/cores.py) equal torch's
own `nn.LSTMCell` and `nn.GRUCell` run member by member, forward and backward; the actors' NumPy
cells (common/recurrent.py) equal them too; and an unrolled rollout zeroes a slot's state where
its episode starts, as if each episode had been run alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlmq.common import recurrent
from rlmq.learners import cores

P, N, IN, H, T = 3, 5, 6, 4, 7  # members, slots, input width, hidden size, steps
CELLS = {"lstm": torch.nn.LSTMCell, "gru": torch.nn.GRUCell}


def members(kind: str) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [CELLS[kind](IN, H) for _ in range(P)]


def stacked(cells: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The members' weights stacked [P, ...], as leaves of their own (gradients compared)."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return {n: torch.stack([getattr(c, n).detach() for c in cells]).requires_grad_() for n in names}


def reference_step(kind: str, cell: torch.nn.Module, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    if kind == "lstm":
        h, c = cell(x, (state[:, :H], state[:, H:]))
        return torch.cat([h, c], dim=1)
    return cell(x, state)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_populations_cell_steps_equal_torchs_cells_member_by_member_with_their_gradients(kind: str) -> None:
    cells, size = members(kind), recurrent.STATE_PARTS[kind] * H
    weights = stacked(cells)
    gen = torch.Generator().manual_seed(1)
    x, state = torch.randn(P, T, N, IN, generator=gen), torch.randn(P, N, size, generator=gen)
    starts = torch.rand(P, T, N, generator=gen) < 0.2
    out, final = cores.unroll(kind, x, state, starts, weights)
    (out.square().sum() + final.sum()).backward()

    for m, cell in enumerate(cells):
        s, hs = state[m], []
        for t in range(T):
            s = reference_step(kind, cell, x[m, t], s * (~starts[m, t]).unsqueeze(1))
            hs.append(s[:, :H])
        torch.testing.assert_close(out[m], torch.stack(hs), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(final[m], s, rtol=1e-5, atol=1e-6)
        (torch.stack(hs).square().sum() + s.sum()).backward()
        for name, grad in weights.items():
            assert grad.grad is not None
            torch.testing.assert_close(grad.grad[m], getattr(cell, name).grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_actors_numpy_cells_equal_the_learners(kind: str) -> None:
    cells, size = members(kind), recurrent.STATE_PARTS[kind] * H
    weights = {n: t.detach() for n, t in stacked(cells).items()}
    rng = np.random.default_rng(2)
    x, state = rng.normal(size=(P, N, IN)).astype(np.float32), rng.normal(size=(P, N, size)).astype(np.float32)
    no_start = torch.zeros(P, 1, N, dtype=torch.bool)  # one step of the learners' unroll
    out, nxt = cores.unroll(kind, torch.from_numpy(x)[:, None], torch.from_numpy(state), no_start, weights)
    h = out[:, 0]
    for m in range(P):
        w = {n: t[m].numpy() for n, t in weights.items()}
        if kind == "lstm":
            got = recurrent.lstm_step(x[m], state[m], w["weight_ih"], w["weight_hh"], w["bias_ih"] + w["bias_hh"])
        else:
            got = recurrent.gru_step(x[m], state[m], w["weight_ih"], w["weight_hh"], w["bias_ih"], w["bias_hh"])
        np.testing.assert_allclose(got[0], h[m].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], nxt[m].numpy(), rtol=1e-5, atol=1e-6)


def test_an_episode_start_zeroes_only_its_slots_state() -> None:
    state = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = recurrent.reset(state, np.array([False, True, False]))
    assert out.dtype == np.float32 and out[1].tolist() == [0, 0, 0, 0]
    np.testing.assert_array_equal(out[[0, 2]], state[[0, 2]])
