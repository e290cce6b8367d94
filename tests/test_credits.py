"""Credit-based flow control: the ledger a learner rank keeps of who may send it a rollout."""

from __future__ import annotations

import numpy as np
import pytest

from rlmq.learners.credits import CreditLedger

A, B, C, D = b"actor-a", b"actor-b", b"actor-c", b"actor-d"


def test_grants_go_to_waiting_actors_up_to_the_budget() -> None:
    ledger = CreditLedger(budget=2, timeout_s=10.0)
    assert ledger.grant(now=0.0, queued=0) == []  # nobody asked
    for actor in (A, B, C):
        ledger.hello(actor)
    assert ledger.grant(now=0.0, queued=0) == [A, B]
    assert ledger.in_flight == 2
    assert ledger.grant(now=1.0, queued=0) == []  # C waits: the budget is spent


@pytest.mark.parametrize(
    ("budget", "queued", "granted"), [(3, 0, 3), (3, 1, 2), (3, 3, 0), (3, 5, 0)]
)
def test_queued_rollouts_count_against_the_budget(budget: int, queued: int, granted: int) -> None:
    ledger = CreditLedger(budget=budget, timeout_s=10.0)
    for actor in (A, B, C, D):
        ledger.hello(actor)
    assert ledger.grant(now=0.0, queued=queued) == [A, B, C, D][:granted]
    assert ledger.in_flight == granted


def test_waiting_actors_are_served_first_come_first_served() -> None:
    ledger = CreditLedger(budget=1, timeout_s=10.0)
    for actor in (A, B, C):
        ledger.hello(actor)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.delivered(A)  # A asks again, behind B and C
    assert ledger.grant(now=0.1, queued=0) == [B]
    ledger.delivered(B)
    assert ledger.grant(now=0.2, queued=0) == [C]
    ledger.delivered(C)
    assert ledger.grant(now=0.3, queued=0) == [A]


def test_a_repeated_hello_keeps_its_place_and_earns_one_credit() -> None:
    ledger = CreditLedger(budget=5, timeout_s=10.0)
    ledger.hello(A)
    ledger.hello(B)
    ledger.hello(A)
    ledger.hello(A)
    assert ledger.grant(now=0.0, queued=0) == [A, B]
    assert ledger.in_flight == 2


def test_delivered_frees_the_credit() -> None:
    ledger = CreditLedger(budget=1, timeout_s=10.0)
    ledger.hello(A)
    ledger.hello(B)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.delivered(A)
    assert ledger.in_flight == 0
    # The rollout now sits in the queue, so it still holds the budget ...
    assert ledger.grant(now=0.1, queued=1) == []
    # ... until the learner trains on it.
    assert ledger.grant(now=0.2, queued=0) == [B]


def test_an_unused_credit_is_reclaimed_after_the_timeout() -> None:
    ledger = CreditLedger(budget=1, timeout_s=5.0)
    ledger.hello(A)
    ledger.hello(B)
    assert ledger.grant(now=100.0, queued=0) == [A]
    assert ledger.grant(now=104.9, queued=0) == []  # A may still be busy
    assert ledger.grant(now=105.0, queued=0) == []  # exactly the timeout: not yet
    assert ledger.grant(now=105.1, queued=0) == [B]  # A is taken to be dead
    assert set(ledger.granted) == {B}
    assert list(ledger.waiting) == []  # A is not re-queued: it says hello if it lives


def test_hello_from_an_actor_holding_a_credit_keeps_the_credit() -> None:
    """The hello may have crossed the credit on the wire: granting again would let the actor
    send two rollouts on one budget slot."""
    ledger = CreditLedger(budget=1, timeout_s=10.0)
    ledger.hello(A)
    ledger.hello(B)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.hello(A)
    assert ledger.in_flight == 1 and ledger.holds(A)
    assert list(ledger.waiting) == [B]
    assert ledger.grant(now=0.1, queued=0) == []
    ledger.delivered(A)
    assert not ledger.holds(A)
    assert ledger.grant(now=0.2, queued=0) == [B]


def test_a_lost_credit_comes_back_after_the_timeout() -> None:
    ledger = CreditLedger(budget=1, timeout_s=10.0)
    ledger.hello(A)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.hello(A)  # still waiting: the credit never arrived (the learner's reply was lost)
    assert ledger.grant(now=5.0, queued=0) == []
    assert ledger.grant(now=10.5, queued=0) == [] and ledger.in_flight == 0  # reclaimed
    ledger.hello(A)  # the actor greets again while it starves (actors/actor.py)
    assert ledger.grant(now=11.0, queued=0) == [A]


@pytest.mark.parametrize("seed", range(5))
def test_budget_is_never_exceeded_by_random_traffic(seed: int) -> None:
    """A learner's view of many actors: hellos, restarts, deaths, deliveries and training, at
    random. Live actors use a credit well within the timeout (what the timeout assumes). Credits
    out plus rollouts queued never pass the budget."""
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(1, 5))
    ledger = CreditLedger(budget=budget, timeout_s=3.0)
    actors = [f"actor-{i}".encode() for i in range(int(rng.integers(2, 9)))]
    holding: dict[bytes, float] = {}  # actors holding a credit they will use → granted at
    dead: set[bytes] = set()
    queued = 0
    served: dict[bytes, int] = {actor: 0 for actor in actors}
    for actor in actors:
        ledger.hello(actor)
    now = 0.0
    for _ in range(600):
        now += float(rng.random())
        for actor, since in sorted(holding.items()):
            if now - since > 0.5 * ledger.timeout_s:  # a live actor is never that slow
                del holding[actor]
                ledger.delivered(actor)
                queued += 1
        event = rng.integers(5)
        if event == 0 and holding:  # an actor sends its rollout
            actor = sorted(holding)[rng.integers(len(holding))]
            del holding[actor]
            ledger.delivered(actor)
            queued += 1
        elif event == 1 and queued:  # the learner trains on one rollout
            queued -= 1
        elif event == 2:  # an actor restarts (or a dead one comes back) and says hello
            actor = actors[rng.integers(len(actors))]
            holding.pop(actor, None)
            dead.discard(actor)
            ledger.hello(actor)
        elif event == 3 and rng.random() < 0.2:  # an actor dies, credit and all
            actor = actors[rng.integers(len(actors))]
            holding.pop(actor, None)
            dead.add(actor)
        for actor in ledger.grant(now, queued):
            served[actor] += 1
            if actor not in dead:
                holding[actor] = now
        assert ledger.in_flight + queued <= budget
        assert len(ledger.granted) == ledger.in_flight
        assert not set(ledger.granted) & set(ledger.waiting)
        assert holding.keys() <= ledger.granted.keys()
    assert sum(served.values()) > 3 * budget  # the traffic really flowed
