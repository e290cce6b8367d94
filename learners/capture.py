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
BACKEND = "inductor"  # torch.compile's backend; the tests trace with "aot_eager" (see `compiled`)


def compiled(fn: F, mode: str, backend: str = "") -> F:
    """`fn` under torch.compile in `mode` (one of COMPILE_MODES but "off"), with `backend` (""
    : `BACKEND`). "inductor" generates kernels; "aot_eager" runs the same captured graphs, forward
    and backward, with eager kernels: the capture checked in seconds, not minutes of code generation.

    Under "reduce-overhead" each call marks a new CUDA-graph step and returns copies of its
    outputs: a graph's outputs live in memory its next replay overwrites, and the learners read
    some (a loss for the stats, SAC's log-probabilities for the temperature) after further
    compiled calls. Every caller has run its backward before the next compiled call."""
    if mode not in COMPILE_MODES[1:]:
        raise ValueError(f"compile mode {mode!r} is not one of {', '.join(COMPILE_MODES[1:])}")
    backend = backend or BACKEND
    graph = torch.compile(fn, backend=backend) if backend != "inductor" else torch.compile(fn, mode=mode)
    if mode != "reduce-overhead":
        return graph  # type: ignore[return-value]

    def replayed(*args: object, **kwargs: object) -> object:
        torch.compiler.cudagraph_mark_step_begin()
        return _copied(graph(*args, **kwargs))

    return replayed  # type: ignore[return-value]


def _copied(out: object) -> object:
    """`out` with each tensor in it cloned (tuples and NamedTuples rebuilt); autograd flows through."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        items = [_copied(item) for item in out]
        return type(out)._make(items) if hasattr(out, "_fields") else tuple(items)  # type: ignore[attr-defined]
    return out
