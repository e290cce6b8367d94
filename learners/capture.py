"""The learners' updates captured by torch.compile (`RunConfig.compile_update`), and on a GPU
replayed as CUDA graphs: LeanRL's lesson (torch.compile and CUDA graphs over CleanRL's scripts made
their PPO and SAC updates several times faster on an H100) for population updates that on a GPU are bound by
kernel launches and Python, not by the GPU (docs/architecture.md, "The update, captured").

What is captured, per gradient step (PPO's in `ppo.capture`, the off-policy algorithms' in their
`capture`):
- each loss, forward and backward (AOTAutograd derives the backward): one graph each. While
  traced, the networks take plain autograd ops (`stacked_mlp.traced`), which the compiler fuses, in
  place of the hand-written Functions and NumPy calls that make the eager path fast on a CPU;
- the clipping and the optimizer step (`optim.clip_and_step`): one graph per optimizer.
Not captured: the gradient's all-reduce between the two. It runs eagerly, one collective per
gradient step and optimizer on every rank in the same order as on the eager path, so the ranks stay
in step; captured PPO needs no DDP wrapper. Random draws are made eagerly and passed in.

The eager path stays the reference (tests hold the two equal on the same data) and the default:
compiling takes longer than a CartPole run on a CPU (benchmarks/RESULTS.md §12).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from rlmq.common.config import COMPILE_MODES

F = TypeVar("F", bound=Callable[..., object])


def compiled(fn: F, mode: str, backend: str = "inductor") -> F:
    """`fn` under torch.compile in `mode` (one of COMPILE_MODES but "off"). `backend`: "inductor"
    generates kernels; the tests also trace with "aot_eager", which runs the captured graphs with
    eager kernels (the capture checked in seconds, not minutes of code generation)."""
    if mode not in COMPILE_MODES[1:]:
        raise ValueError(f"compile mode {mode!r} is not one of {', '.join(COMPILE_MODES[1:])}")
    if backend != "inductor":
        return torch.compile(fn, backend=backend)  # type: ignore[return-value]
    return torch.compile(fn, mode=mode)  # type: ignore[return-value]
