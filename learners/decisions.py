"""A population decision applied to a learner rank's trainer, the same on every rank.

A PBT decision gives its target new hyperparameters and, after an exploit, the source's weights and
optimizer state (plus noise seeded by the decision id, the same everywhere), and its network's new
shape (activation, widths). A CEM-RL generation gives every member its drawn actor. A DvD weight
sets λ for all. What follows for the learner's queues, versions and publishing depends on which
members now play another policy, which `Applied` says; the learner does that part (learner.py).
"""

from __future__ import annotations

import dataclasses
import logging

from rlmq.common import wire
from rlmq.common.architecture import member_shape, member_widths
from rlmq.learners.offpolicy import OffPolicyTrainer
from rlmq.learners.pbt_state import PbtState
from rlmq.learners.trainers import Trainer

log = logging.getLogger("rlmq.learner")


@dataclasses.dataclass(frozen=True)
class Applied:
    """The members a decision gave other weights (another policy from now on), and whether their
    queued rollouts must go: a PBT copy's or reshape's are another policy's, which an on-policy
    update cannot use and an exploit's copied replay does not hold; a CEM-RL draw's stay (the shared
    replay takes any policy's)."""

    replaced: tuple[int, ...] = ()
    drops_queued: bool = False


def apply(decision: wire.Message, pbt: PbtState, trainer: Trainer) -> Applied:
    """Apply the next decision to `pbt` (checked: the same id on every rank) and to `trainer`."""
    # The source's network shape before the decision: a copy's weights have it (the target's own,
    # for an explore), which the decision's may change (common/architecture.py).
    before = dict(pbt.hyperparams[decision.source]) if isinstance(decision, wire.Decision) else {}
    decision = pbt.apply(decision)
    if isinstance(decision, wire.DiversityWeight):
        assert isinstance(trainer, OffPolicyTrainer)  # RunConfig allows DvD for SAC and TD3 only
        trainer.set_diversity_weight(decision.weight)
        log.info("applied DvD weight %d: λ %g", decision.id, decision.weight)
        return Applied()
    if isinstance(decision, wire.Generation):
        assert isinstance(trainer, OffPolicyTrainer)  # RunConfig allows CEM for SAC and TD3 only
        trainer.start_generation(decision)
        trained = [m for m, t in enumerate(decision.trained) if t]
        log.info("applied CEM generation %d: trained %s", decision.id, trained)
        return Applied(tuple(range(len(decision.actors))))
    copied = decision.source != decision.target
    if copied:
        trainer.copy_member(decision)
    widths, new_widths = member_widths(before), member_widths(decision.hyperparams)
    if widths is not None and new_widths is not None and widths != new_widths:
        trainer.grow_member(decision.target, widths, new_widths, decision.id)
    trainer.set_hyperparams(pbt.hyperparams)  # and a narrower layer's units zeroed
    log.info("applied PBT decision %d: member %d ← %d", decision.id, decision.target, decision.source)
    if copied or member_shape(decision.hyperparams) != member_shape(before):
        return Applied((decision.target,), drops_queued=True)
    return Applied()
