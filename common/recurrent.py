"""Recurrent cores in NumPy, as an actor steps them: one LSTM or GRU step for a batch of env slots.

The learners step the same cells in torch for a whole population at once (learners/cores.py);
both follow torch's `nn.LSTMCell` and `nn.GRUCell` exactly, weights named and laid out as theirs
(`weight_ih` [G·H, I], `weight_hh` [G·H, H], `bias_ih`, `bias_hh` [G·H]; gates i, f, g, o for the
LSTM and r, z, n for the GRU), so a member's state dict is the same contract either side reads.

A state is one array [N, S·H]: the LSTM's h and c side by side (S = 2), the GRU's h (S = 1); an
episode's first step starts from zeros (`reset`).
"""

from __future__ import annotations

import numpy as np

CORES = ("identity", "lstm", "gru")
STATE_PARTS = {"identity": 0, "lstm": 2, "gru": 1}  # hidden-size blocks in a state


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (np.tanh(0.5 * x) + 1.0)  # no overflow for large |x|
    return out


def lstm_step(
    x: np.ndarray, state: np.ndarray, weight_ih: np.ndarray, weight_hh: np.ndarray, bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(output h [N, H], next state [N, 2H]) of one LSTM step from `x` [N, I] and `state` [N, 2H];
    `bias` is bias_ih + bias_hh."""
    hidden = weight_hh.shape[1]
    h, c = state[:, :hidden], state[:, hidden:]
    gates = x @ weight_ih.T + h @ weight_hh.T + bias
    i, f, g, o = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    return h, np.concatenate([h, c], axis=1)


def gru_step(
    x: np.ndarray,
    state: np.ndarray,
    weight_ih: np.ndarray,
    weight_hh: np.ndarray,
    bias_ih: np.ndarray,
    bias_hh: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(output h [N, H], next state h [N, H]) of one GRU step, as `nn.GRUCell`: the candidate's
    hidden term is r ⊙ (W_hn h + b_hn)."""
    hidden = weight_hh.shape[1]
    from_x = x @ weight_ih.T + bias_ih
    from_h = state @ weight_hh.T + bias_hh
    r = _sigmoid(from_x[:, :hidden] + from_h[:, :hidden])
    z = _sigmoid(from_x[:, hidden : 2 * hidden] + from_h[:, hidden : 2 * hidden])
    n = np.tanh(from_x[:, 2 * hidden :] + r * from_h[:, 2 * hidden :])
    h = (1.0 - z) * n + z * state
    return h, h


def reset(state: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`state` [N, ...] with the slots whose episode starts now (`starts` [N] bool) zeroed."""
    return np.where(starts[:, None], np.float32(0.0), state).astype(state.dtype, copy=False)


CORE_WEIGHTS = ("core.weight_ih", "core.weight_hh", "core.bias_ih", "core.bias_hh")  # nn.LSTMCell's, nn.GRUCell's


class NumpyCore:
    """A member's core as an actor steps it: built from the weights' ``core.*`` tensors (the kind
    read off their shapes: four gate blocks an LSTM, three a GRU), each call one step that advances
    the caller's state in place (one array per env slot, kept by the caller across steps and weight
    updates)."""

    def __init__(self, params: dict[str, np.ndarray], width: int) -> None:
        weight_ih, weight_hh, bias_ih, bias_hh = (np.asarray(params[name], np.float32) for name in CORE_WEIGHTS)
        hidden = weight_hh.shape[1] if weight_hh.ndim == 2 else 0
        gates = weight_hh.shape[0] // max(hidden, 1)
        self.kind = {4: "lstm", 3: "gru"}.get(gates, "")
        if (
            not self.kind
            or hidden < 1
            or weight_hh.shape != (gates * hidden, hidden)
            or weight_ih.shape != (gates * hidden, width)
            or not bias_ih.shape == bias_hh.shape == (gates * hidden,)
        ):
            raise ValueError(
                f"core weights {weight_ih.shape}, {weight_hh.shape} are no LSTM or GRU cell on {width} inputs"
            )
        self.size, self.state_size = hidden, STATE_PARTS[self.kind] * hidden
        self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh = weight_ih, weight_hh, bias_ih, bias_hh
        self.bias = bias_ih + bias_hh  # the LSTM's two biases are one

    def __call__(self, x: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The core's output [N, size] for inputs `x` [N, width]; `state` [N, state_size] advanced."""
        if state.shape != (len(x), self.state_size):
            raise ValueError(f"core state {state.shape}, the core steps [{len(x)}, {self.state_size}]")
        if self.kind == "lstm":
            h, state[:] = lstm_step(x, state, self.weight_ih, self.weight_hh, self.bias)
        else:
            h, state[:] = gru_step(x, state, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        return h
