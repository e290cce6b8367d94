"""Temporally correlated ("colored") Gaussian exploration noise for continuous actions.

White noise, drawn afresh each step, averages out within a few steps: a policy whose mean fires an
engine on most steps almost never leaves it off for the dozens of steps in a row that a descent
needs. Noise whose power spectrum falls as 1/f^β keeps each step's N(0, 1) marginal but wanders:
β = 0 is white, 1 pink, 2 red (Brownian-like). Pink noise made a better default than white or
red (Ornstein-Uhlenbeck-like) for off-policy continuous control across many tasks (Eberhard et al.,
"Pink Noise Is All You Need", ICLR 2023), where it replaces the draws of SAC's and TD3's actors.

Each env slot and action dimension gets one sequence of `horizon` steps (the env's time limit,
within bounds), drawn whole by the Fourier method of Timmer & König (1995) as the `colorednoise`
package does, and a new one when the slot's episode ends or the sequence runs out.
"""

from __future__ import annotations

import numpy as np

from rlmq.common.schema import EnvSpec

DEFAULT_HORIZON = 1000  # steps of one sequence where the env declares no time limit
MAX_HORIZON = 10_000  # and at most: a sequence is held whole, [slots, horizon, dims] floats


def horizon_for(time_limit: int | None) -> int:
    """How many steps one sequence spans: the env's time limit, within bounds (a longer episode
    draws a new sequence when one is spent)."""
    return min(time_limit or DEFAULT_HORIZON, MAX_HORIZON)


def powerlaw_noise(beta: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Gaussian sequences along the last axis of `shape` with power spectrum ∝ 1/f^β and unit
    variance at every step (over the ensemble; one sequence's own variance is lower for β > 0)."""
    steps = shape[-1]
    freqs = np.fft.rfftfreq(steps)
    freqs[0] = 1.0 / steps  # the lowest frequency a sequence this long resolves stands in for 0
    amplitude = freqs ** (-beta / 2.0)
    # The standard deviation the inverse transform below gives, to divide out: each term between the
    # constant and the Nyquist one counts twice (its conjugate), those two once with √2 × amplitude.
    # (colorednoise's leaves the constant term out: for β > 0 its variance comes out above 1.)
    variance = 2.0 * amplitude[0] ** 2 + 4.0 * np.sum(amplitude[1:] ** 2)
    if steps % 2 == 0:
        variance -= 2.0 * amplitude[-1] ** 2
    sigma = np.sqrt(variance) / steps
    real = rng.standard_normal((*shape[:-1], freqs.size)) * amplitude
    imag = rng.standard_normal((*shape[:-1], freqs.size)) * amplitude
    if steps % 2 == 0:  # the Nyquist term of an even length is real
        imag[..., -1] = 0.0
        real[..., -1] *= np.sqrt(2.0)
    imag[..., 0] = 0.0  # so is the constant term
    real[..., 0] *= np.sqrt(2.0)
    noise: np.ndarray = np.fft.irfft(real + 1j * imag, n=steps, axis=-1) / sigma
    return noise


class ColoredNoise:
    """Standard-normal draws [slots, dims] per step, each (slot, dim) a 1/f^β sequence in time."""

    def __init__(self, beta: float, slots: int, dims: int, horizon: int, rng: np.random.Generator) -> None:
        if beta < 0 or horizon < 2:
            raise ValueError(f"colored noise needs beta ≥ 0 and a horizon ≥ 2 steps, got {beta}, {horizon}")
        self.beta, self.horizon, self.rng = beta, horizon, rng
        self.sequences = np.empty((slots, horizon, dims), np.float32)  # time on axis 1: a step reads one row per slot
        self.index = np.zeros(slots, np.int64)
        self.slots = np.arange(slots)
        self.restart(np.ones(slots, dtype=bool))

    def sample(self) -> np.ndarray:
        """This step's draws, [slots, dims]; a slot whose sequence is spent starts a new one."""
        spent = self.index >= self.horizon
        if spent.any():
            self.restart(spent)
        draws = self.sequences[self.slots, self.index]
        self.index += 1
        return draws

    def restart(self, slots: np.ndarray) -> None:
        """New sequences for the slots marked in the boolean mask `slots` (their episodes ended)."""
        count = int(np.count_nonzero(slots))
        if count:
            fresh = powerlaw_noise(self.beta, (count, self.sequences.shape[2], self.horizon), self.rng)
            self.sequences[slots] = fresh.transpose(0, 2, 1)
            self.index[slots] = 0


def colored_noise_for(
    noise_color: float,
    spec: EnvSpec,
    slots: int,
    time_limit: int | None,
    rng: np.random.Generator,
    current: ColoredNoise | None = None,
) -> ColoredNoise | None:
    """The noise a policy of `noise_color` acts with in `slots` env slots: None for white noise or
    discrete actions; `current` where it has that color already, so that each sequence runs on."""
    if noise_color <= 0 or spec.action_kind != "continuous":
        return None
    if current is not None and current.beta == noise_color:
        return current
    return ColoredNoise(noise_color, slots, spec.action_dim, horizon_for(time_limit), rng)
