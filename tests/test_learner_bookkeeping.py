"""A learner's bookkeeping, alone: the PBT decisions it keeps and applies (pbt_state.py) and the
messages it sends with a credit (credit_messages.py). The learner service uses both in test_services.py
and test_population.py; these pin down their rules without a world or a socket."""

from __future__ import annotations

import numpy as np
import pytest

from rlmq.common import wire
from rlmq.common.algorithms import ALGORITHMS
from rlmq.learners.credit_messages import MAX_ACTORS_REMEMBERED, CreditMessages
from rlmq.learners.pbt_state import MAX_PENDING, PbtState

TUNABLE = ALGORITHMS["ppo"].tunable


def hyperparams(value: float) -> dict[str, float]:
    return dict.fromkeys(TUNABLE, value)


def decision(decision_id: int, target: int = 1, source: int = 0, value: float = 0.1) -> wire.Decision:
    return wire.Decision(id=decision_id, target=target, source=source, hyperparams=hyperparams(value))


def kept(state: PbtState, d: wire.Decision) -> None:
    state.keep(d, wire.encode(d))


def test_decisions_are_offered_one_at_a_time_in_id_order_whatever_order_they_came_in() -> None:
    state = PbtState([hyperparams(0.2) for _ in range(3)])
    kept(state, decision(2, target=2, value=0.3))
    assert state.offer() == b""  # decision 1 has not come yet
    kept(state, decision(1, target=1, value=0.1))
    kept(state, decision(1, target=1, value=0.1))  # the broadcast repeats until a report says applied
    for expected_id, target, value in ((1, 1, 0.1), (2, 2, 0.3)):
        applied = state.apply(wire.decode(state.offer()))
        assert (applied.id, applied.target, state.applied) == (expected_id, target, expected_id)
        assert state.hyperparams[target] == hyperparams(value)
    assert state.offer() == b"" and state.pending == {}
    assert state.hyperparams[0] == hyperparams(0.2)  # no decision named it


def test_applied_or_far_future_decisions_are_not_kept() -> None:
    state = PbtState([hyperparams(0.2), hyperparams(0.2)], applied=5)
    kept(state, decision(5))
    kept(state, decision(5 + MAX_PENDING + 1))
    assert state.pending == {}
    kept(state, decision(5 + MAX_PENDING))
    assert list(state.pending) == [5 + MAX_PENDING]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (decision(1, target=2), "unknown_member"),
        (decision(1, source=3), "unknown_member"),
        (wire.Decision(id=1, target=1, source=0, hyperparams={"learning_rate": 1e-3}), "bad_value"),
    ],
)
def test_a_decision_the_population_cannot_take_is_refused_and_nothing_is_kept(bad: wire.Decision, reason: str) -> None:
    state = PbtState([hyperparams(0.2), hyperparams(0.2)])
    with pytest.raises(wire.WireError) as refused:
        kept(state, bad)
    assert refused.value.reason == reason and state.pending == {} and state.offer() == b""


def test_applying_anything_but_the_next_decision_is_a_bug_not_bad_input() -> None:
    """Every rank decodes the same bytes: a gap means the ranks' states have parted."""
    state = PbtState([hyperparams(0.2), hyperparams(0.2)], applied=3)
    with pytest.raises(RuntimeError, match="decision 5 offered after 3"):
        state.apply(decision(5))
    with pytest.raises(RuntimeError, match="offered after 3"):
        state.apply(wire.Credit())
    assert state.applied == 3 and state.hyperparams == [hyperparams(0.2), hyperparams(0.2)]


def generation(generation_id: int, members: int = 2) -> wire.Generation:
    actors = tuple({"policy.0.weight": np.full((2, 3), float(m), np.float32)} for m in range(members))
    return wire.Generation(id=generation_id, actors=actors, trained=(True,) + (False,) * (members - 1))


def test_a_world_behind_skips_to_the_newest_generation_and_every_member_takes_its_lineage() -> None:
    """A CEM-RL generation sets every member's actor, so all an earlier one set: a world resumed
    from an older checkpoint takes the newest at once, and only later ids after it."""
    state = PbtState([hyperparams(0.2), hyperparams(0.2)], applied=3)
    for later in (generation(6), generation(5)):
        state.keep(later, wire.encode(later))
    taken = state.apply(wire.decode(state.offer()))
    assert isinstance(taken, wire.Generation) and taken.id == 6
    assert (state.applied, state.copied_by, state.pending, state.offer()) == (6, [6, 6], {}, b"")
    with pytest.raises(RuntimeError, match="offered after 6"):
        state.apply(generation(6))  # taken already
    with pytest.raises(wire.WireError) as refused:
        state.keep(generation(7, members=3), wire.encode(generation(7, members=3)))
    assert refused.value.reason == "bad_value" and state.pending == {}


def test_the_pbt_state_reads_the_learner_record_of_checkpoints_already_written() -> None:
    """A checkpoint's "learner" record, as checkpoints written before PbtState hold it."""
    written = {
        "versions": [4, 9],
        "applied": 3,
        "hyperparams": [hyperparams(0.2), hyperparams(0.3)],
        "rank": 0,
        "world_size": 2,
        "time": 1.7e9,
    }
    state = PbtState.from_json(written)
    assert (state.applied, state.hyperparams) == (3, [hyperparams(0.2), hyperparams(0.3)])
    assert set(state.to_json()) == {"applied", "hyperparams", "copied_by"}  # the keys it writes into that record
    assert state.copied_by == [0, 0]  # no copy is known from a record that does not say


def test_the_state_a_checkpoint_holds_comes_back_equal_and_unshared() -> None:
    state = PbtState([hyperparams(0.2), hyperparams(0.4)], applied=7)
    kept(state, decision(8))
    back = PbtState.from_json(state.to_json())
    assert (back.applied, back.hyperparams, back.pending) == (7, state.hyperparams, {})
    back.hyperparams[0]["learning_rate"] = 9.0
    assert state.hyperparams[0]["learning_rate"] == 0.2


class Encoder:
    """Encodes member weights as the learner does, counting the encodings."""

    def __init__(self) -> None:
        self.versions = [0, 0]
        self.encoded = 0

    def __call__(self, member: int) -> bytes:
        self.encoded += 1
        return wire.encode(
            wire.Weights(
                member=member,
                version=self.versions[member],
                params={"w": np.full(2, self.versions[member], np.float32)},
            )
        )


def sent(encoded: list[bytes]) -> list[tuple[str, int]]:
    messages = [wire.decode(e) for e in encoded]
    return [(type(m).__name__, m.version if isinstance(m, wire.Weights) else m.policy_version) for m in messages]


def test_an_actor_gets_each_version_of_its_members_weights_once_ahead_of_a_credit_naming_it() -> None:
    encoder = Encoder()
    credit_messages = CreditMessages(encoder)
    assert sent(credit_messages.for_credit(b"a", 0, 0)) == [("Weights", 0), ("Credit", 0)]
    assert sent(credit_messages.for_credit(b"a", 0, 0)) == [("Credit", 0)]
    assert sent(credit_messages.for_credit(b"b", 0, 0)) == [("Weights", 0), ("Credit", 0)]
    assert encoder.encoded == 1  # one encoding for every actor
    encoder.versions[0] = 1
    assert sent(credit_messages.for_credit(b"a", 0, 1)) == [("Weights", 1), ("Credit", 1)]
    assert sent(credit_messages.for_credit(b"a", 1, 0)) == [("Weights", 0), ("Credit", 0)]  # another member's
    assert encoder.encoded == 3
    assert credit_messages.encoded_weights(0, 1) == credit_messages.for_credit(b"c", 0, 1)[0]


def test_the_actors_remembered_are_bounded_and_a_forgotten_one_gets_the_weights_again() -> None:
    credit_messages = CreditMessages(Encoder())
    for actor in range(MAX_ACTORS_REMEMBERED + 1):
        credit_messages.for_credit(actor.to_bytes(4, "big"), 0, 0)
    assert len(credit_messages.sent) == MAX_ACTORS_REMEMBERED
    assert len(credit_messages.for_credit((0).to_bytes(4, "big"), 0, 0)) == 2  # the oldest was forgotten
    assert len(credit_messages.for_credit((MAX_ACTORS_REMEMBERED).to_bytes(4, "big"), 0, 0)) == 1
