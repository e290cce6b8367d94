"""A learner rank's share of population-based training: the hyperparameters each member trains
with, the id of the last decision applied, and rank 0's decisions received but not applied yet.

The coordinator repeats a decision on its broadcast until a learner reports it applied. Rank 0
keeps each one it can take, and the world applies them strictly in id order, one at an update
every rank agrees on (learner.py), so that every rank holds the same state at the same iteration.
A CEM-RL generation and DvD's adaptive weight share the ids; each sets all that an earlier one of
its kind did, so it may be taken ahead of them (a world resumed from an older checkpoint skips to
the newest). This class is the bookkeeping; the learner copies the weights and optimizer state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlmq.common import wire

Kept = wire.Decision | wire.Generation | wire.DiversityWeight  # what the broadcast's "pbt." topic brings
MAX_PENDING = 1024  # decisions kept ahead of the one to apply next; the rebroadcast brings later ones again


@dataclasses.dataclass
class PbtState:
    """Where the population's hyperparameters stand on this rank, and what rank 0 holds to apply."""

    hyperparams: list[dict[str, float]]  # per member
    applied: int = 0  # id of the last decision applied
    pending: dict[int, bytes] = dataclasses.field(default_factory=dict)  # rank 0: id → the decision, encoded
    replacing: set[int] = dataclasses.field(default_factory=set)  # rank 0: pending ids that may be taken ahead
    # Per member, the id of the last decision that copied another member's weights into it (0: none).
    copied_by: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.copied_by = self.copied_by or [0] * len(self.hyperparams)

    def check(self, decision: Kept) -> None:
        """A WireError for a decision this population cannot take: a member it does not have, or
        hyperparameters other than the ones its members train with; a generation of another size."""
        if isinstance(decision, wire.DiversityWeight):
            return
        if isinstance(decision, wire.Generation):
            if len(decision.actors) != len(self.hyperparams):
                raise wire.WireError(
                    "bad_value",
                    f"generation {decision.id}: {len(decision.actors)} actors, {len(self.hyperparams)} members",
                )
            return
        for role, member in (("target", decision.target), ("source", decision.source)):
            if not 0 <= member < len(self.hyperparams):
                raise wire.WireError(
                    "unknown_member", f"decision {decision.id}'s {role}: member {member} of {len(self.hyperparams)}"
                )
        if set(decision.hyperparams) != set(self.hyperparams[decision.target]):
            raise wire.WireError(
                "bad_value",
                f"decision {decision.id} sets {sorted(decision.hyperparams)}, "
                f"not {sorted(self.hyperparams[decision.target])}",
            )

    def keep(self, decision: Kept, encoded: bytes) -> None:
        """Hold a checked decision until its turn; repeats are normal, and ids already applied or
        too far ahead are not kept. A generation or a DvD weight may be taken as soon as it comes."""
        self.check(decision)
        if self.applied < decision.id <= self.applied + MAX_PENDING:
            self.pending[decision.id] = encoded
            if not isinstance(decision, wire.Decision):
                self.replacing.add(decision.id)

    def offer(self) -> bytes:
        """The encoded decision to apply next, or of the newest generation or DvD weight held
        (which sets all an earlier one would), or b"" if rank 0 has neither."""
        if self.applied + 1 not in self.pending and self.replacing:
            return self.pending[max(self.replacing)]
        return self.pending.get(self.applied + 1, b"")

    def apply(self, decision: wire.Message) -> Kept:
        """Take the next decision's hyperparameters, a generation's new lineage for every member, or
        a DvD weight. Every rank decodes the same bytes, so anything but the next id (or a later
        generation or weight) means the ranks' states have parted: a bug, not bad input."""
        next_id = isinstance(decision, wire.Decision) and decision.id == self.applied + 1
        replacing = isinstance(decision, (wire.Generation, wire.DiversityWeight)) and decision.id > self.applied
        if not (next_id or replacing):
            raise RuntimeError(f"decision {getattr(decision, 'id', '?')} offered after {self.applied}")
        assert isinstance(decision, (wire.Decision, wire.Generation, wire.DiversityWeight))
        if isinstance(decision, wire.Generation):
            self.copied_by = [decision.id] * len(self.hyperparams)
        elif isinstance(decision, wire.Decision):
            self.hyperparams[decision.target] = dict(decision.hyperparams)
            if decision.source != decision.target:
                self.copied_by[decision.target] = decision.id
        self.applied = decision.id
        self.pending = {i: encoded for i, encoded in self.pending.items() if i > decision.id}
        self.replacing = {i for i in self.replacing if i > decision.id}
        return decision

    def to_json(self) -> dict[str, Any]:
        """What a checkpoint holds and what rank 0 shares with the other ranks at the start."""
        return {
            "applied": self.applied,
            "hyperparams": [dict(h) for h in self.hyperparams],
            "copied_by": self.copied_by,
        }

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> PbtState:
        copied_by = [int(i) for i in state.get("copied_by", [])]  # checkpoints before cores hold none
        return cls([dict(h) for h in state["hyperparams"]], int(state["applied"]), copied_by=copied_by)
