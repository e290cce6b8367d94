"""Adam and gradient clipping for a population stacked into one [P, D] parameter.

Each member has its own learning rate and clipping norm, and its own step count. A member that
had no data in an update is *inactive*: its parameters, moments and step count stay exactly as
they were (a plain Adam step on a zero gradient would still move it along its momentum). The
maths is torch.optim.Adam's (no weight decay, no amsgrad), row by row; the tests hold the two
against each other.

A member whose gradient is not finite skips the step the same way, and is counted: one rollout
with an absurd reward (or an env bug) would otherwise turn its weights and moments into NaN for
good. The check is on the gradient after the all-reduce, which every rank holds alike, so every
rank skips alike (a non-finite loss on one rank makes the all-reduced gradient non-finite).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

H = TypeVar("H")
Sync = Callable[[Tensor], None]  # averages a gradient across learner ranks, in place


def per_member(cls: type[H], members: Sequence[Mapping[str, float]], device: torch.device) -> H:
    """A NamedTuple of hyperparameter tensors [P] (one per field of `cls`) from each member's values."""
    fields: Any = cls._fields  # type: ignore[attr-defined]
    return cls(*(torch.tensor([m[name] for m in members], dtype=torch.float32, device=device) for name in fields))


def clip_grad_norm_per_member(grad: Tensor, max_norm: Tensor) -> Tensor:
    """Scale each member's gradient row to norm ≤ max_norm[m] (as `clip_grad_norm_`); returns the
    norms before clipping. Under DDP this runs after the all-reduce: clipping is non-linear."""
    norms = torch.linalg.vector_norm(grad, dim=1)
    grad.mul_((max_norm / (norms + 1e-6)).clamp(max=1.0).unsqueeze(1))
    return norms


# On the CPU, members whose rows hold at least this many parameters step one at a time through
# torch's fused Adam kernel: one pass over each row, where the ops over [P, D] make several, each
# with full-size temporaries (fresh pages to fault in once past malloc's mmap threshold). From about
# this width the fused rows are the faster way at P = 4–32; at CartPole's width the ops over [P, D]
# are as fast or faster (benchmarks/LOG.md §10).
FUSED_ROW_MIN = 16_384


class PopulationAdam:
    STATE = ("exp_avg", "exp_avg_sq", "steps", "nonfinite")  # what a checkpoint saves (learners/checkpoint.py)

    def __init__(self, param: Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-5) -> None:
        self.param, self.betas, self.eps = param, betas, eps
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        self.steps = torch.zeros(param.shape[0], dtype=param.dtype, device=param.device)
        self.nonfinite = torch.zeros((), dtype=torch.int64, device=param.device)  # member steps skipped

    def zero_grad(self) -> None:
        self.param.grad = None

    @torch.no_grad()
    def step(self, lr: Tensor, active: Tensor | None = None, norms: Tensor | None = None) -> None:
        """One Adam step; `lr` [P] per member, `active` [P] bool (None: all), `norms` [P] the
        gradient's norm per member if the caller has it (clipping does), else taken here."""
        grad = self.param.grad
        assert grad is not None, "step() before backward()"
        finite = torch.isfinite(torch.linalg.vector_norm(grad, dim=1) if norms is None else norms)
        self.nonfinite += (~finite if active is None else active & ~finite).sum()
        active = finite if active is None else active & finite
        if grad.device.type == "cpu" and len(self.steps) == 1:
            if bool(active[0]):
                self._fused_step(self.param, grad, self.exp_avg, self.exp_avg_sq, self.steps, float(lr[0]))
            return
        if grad.device.type == "cpu" and grad.shape[1] >= FUSED_ROW_MIN:
            for m in torch.nonzero(active).flatten().tolist():
                self._fused_step(
                    self.param[m], grad[m], self.exp_avg[m], self.exp_avg_sq[m], self.steps[m : m + 1], float(lr[m])
                )
            return
        beta1, beta2 = self.betas
        if bool(active.all()):
            self.steps += 1
            self.exp_avg.lerp_(grad, 1 - beta1)
            self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            self.param.addcdiv_(*self._numerator_and_denominator(lr), value=-1)
            return
        self.masked_step(grad, lr, active)

    def masked_step(self, grad: Tensor, lr: Tensor, active: Tensor) -> None:
        """The step of the `active` members [P] (finite gradients only) in ops over [P, D], with
        no branch on a tensor's value: what `clip_and_step` captures."""
        beta1, beta2 = self.betas
        keep = active.unsqueeze(1)
        self.steps += active.to(self.steps.dtype)
        self.exp_avg.copy_(torch.where(keep, self.exp_avg.lerp(grad, 1 - beta1), self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(keep, self.exp_avg_sq * beta2 + (1 - beta2) * grad * grad, self.exp_avg_sq))
        numerator, denom = self._numerator_and_denominator(lr)
        self.param.sub_(torch.where(keep, numerator / denom, 0.0))

    def _fused_step(
        self, param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, steps: Tensor, lr: float
    ) -> None:
        """One member on the CPU (its row, or the whole [1, D] of a population of one) through torch's
        fused Adam kernel (torch.optim.Adam's `fused=True`): one pass over the row instead of ~10
        ops, each with its own dispatch. `steps` is a view of the member's count, moved in place."""
        steps += 1
        torch._fused_adam_(
            [param],
            [grad],
            [exp_avg],
            [exp_avg_sq],
            [],
            [steps],
            lr=lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            weight_decay=0.0,
            eps=self.eps,
            amsgrad=False,
            maximize=False,
        )

    def _numerator_and_denominator(self, lr: Tensor) -> tuple[Tensor, Tensor]:
        """(lr / bc1 · m, √v / √bc2 + ε): the update is their quotient, taken by the caller in its
        last pass over [P, D] (`addcdiv_`)."""
        beta1, beta2 = self.betas
        steps = self.steps.clamp(min=1)  # an inactive member may never have stepped
        numerator = self.exp_avg * (lr / (1 - beta1**steps)).unsqueeze(1)
        denom = self.exp_avg_sq.sqrt().mul_((1 - beta2**steps).rsqrt().unsqueeze(1)).add_(self.eps)
        return numerator, denom

    @torch.no_grad()
    def restart(self) -> None:
        """Every member's state as a new optimizer's (CEM-RL's fresh actors), in place: a captured
        step keeps reading the same tensors."""
        for state in (self.exp_avg, self.exp_avg_sq, self.steps):
            state.zero_()

    @torch.no_grad()
    def keep_only(self, keep: Tensor) -> None:
        """Zero the moments outside `keep` [P, D]: parameters a member gave up (learners/shapes.py),
        whose steps must stay zero."""
        self.exp_avg.mul_(keep)
        self.exp_avg_sq.mul_(keep)

    @torch.no_grad()
    def copy_member(self, source: int, target: int) -> None:
        """PBT exploit: the target takes the source's optimizer state (its weights: the caller)."""
        for state in (self.exp_avg, self.exp_avg_sq, self.steps):
            state[target] = state[source]


# An optimizer's step after backward and the all-reduce: (optimizer, each member's clipping norm or
# None, lr [P], active [P]) → the gradient norms [P] before clipping. `clip_then_step` eagerly;
# `clip_and_step` is the same for torch.compile to capture (learners/capture.py).
Step = Callable[[PopulationAdam, Tensor | None, Tensor, Tensor], Tensor]


def clipped(grad: Tensor, max_norm: Tensor | None) -> Tensor:
    """Each member's gradient norm [P], the gradient clipped to `max_norm` in place (None: left)."""
    return torch.linalg.vector_norm(grad, dim=1) if max_norm is None else clip_grad_norm_per_member(grad, max_norm)


def clip_then_step(optimizer: PopulationAdam, max_norm: Tensor | None, lr: Tensor, active: Tensor) -> Tensor:
    """Clip each member's gradient to `max_norm` (None: leave it), then `optimizer.step`."""
    grad = optimizer.param.grad
    assert grad is not None, "step before backward"
    norms = clipped(grad, max_norm)
    optimizer.step(lr, active, norms)
    return norms


@torch.no_grad()
def clip_and_step(optimizer: PopulationAdam, max_norm: Tensor | None, lr: Tensor, active: Tensor) -> Tensor:
    """`clip_then_step` with no branch on a tensor's value, so that torch.compile takes it whole
    (and on a GPU into a CUDA graph): the same arithmetic, member by member."""
    grad = optimizer.param.grad
    assert grad is not None, "step before backward"
    norms = clipped(grad, max_norm)
    finite = torch.isfinite(norms)
    optimizer.nonfinite += (active & ~finite).sum()
    optimizer.masked_step(grad, lr, active & finite)
    return norms


def written_by_step(args: tuple[Any, ...]) -> list[Tensor]:
    """What a `Step` called with `args` writes: its optimizer's parameter, gradient and state (for
    learners/capture.py's `Graphed`)."""
    optimizer: PopulationAdam = args[0]
    assert optimizer.param.grad is not None, "step before backward"
    return [optimizer.param, optimizer.param.grad, *(getattr(optimizer, name) for name in PopulationAdam.STATE)]


def decayed_fraction(steps: Tensor, decay_steps: int, final_fraction: float) -> Tensor:
    """The share of its learning rate each member [P] takes after `steps` gradient steps: 1 falling
    linearly to `final_fraction` at `decay_steps`, then flat (decay_steps 0: always 1)."""
    if decay_steps <= 0:
        return torch.ones_like(steps)
    return 1 - (1 - final_fraction) * (steps / decay_steps).clamp(max=1.0)


def descend(
    optimizer: PopulationAdam,
    loss: Tensor | None,
    lr: Tensor,
    active: Tensor,
    sync: Sync,
    step: Step = clip_then_step,
    max_norm: Tensor | None = None,
) -> Tensor:
    """One optimizer's step on its own loss [P]: backward (None: the loss's gradient is in
    `param.grad` already, `capture.with_gradient`), the gradient averaged across ranks (each
    optimizer is synced on its own), clipped to `max_norm` (None: not), then Adam (which skips
    members whose gradient is not finite). The gradient's norms [P] before clipping."""
    if loss is not None:
        optimizer.param.grad = None
        loss.sum().backward()
    assert optimizer.param.grad is not None
    sync(optimizer.param.grad)
    return step(optimizer, max_norm, lr, active)
