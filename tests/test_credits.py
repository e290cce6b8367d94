"""Credit-based flow control: the ledger a learner rank keeps of who may send it a rollout."""

from __future__ import annotations

import numpy as np
import pytest

from rlmq.learners.credits import PROBATION_SLOTS, CreditLedger, CreditTimeouts

A, B, C, D = b"actor-a", b"actor-b", b"actor-c", b"actor-d"


def ledger_of(budget: int, timeout_s: float) -> CreditLedger:
    """A ledger whose requests never expire and whose grant timeout is fixed at `timeout_s`."""
    return CreditLedger(budget, CreditTimeouts(request_ttl_s=1e9, min_s=timeout_s, max_s=timeout_s))


def proven(ledger: CreditLedger, *actors: bytes, at: float = 0.0) -> None:
    """Each actor joins as newcomers do, on probation one after another (the budget held full by
    rollouts queued meanwhile), and delivers at once: then it asks again, as a proven actor."""
    for actor in actors:
        ledger.hello(actor, at)
        full = ledger.budget_at(at) - ledger.in_budget  # queued: no room within the budget
        assert ledger.grant(now=at, queued=full) == [actor] and ledger.probation == {actor}
        assert ledger.delivered(actor, at, queued=0)


def test_grants_go_to_waiting_actors_up_to_the_budget() -> None:
    ledger = ledger_of(2, 10.0)
    assert ledger.grant(now=0.0, queued=0) == []  # nobody asked
    proven(ledger, A, B, C)
    assert ledger.grant(now=0.0, queued=0) == [A, B]
    assert ledger.in_flight == 2
    assert ledger.grant(now=1.0, queued=0) == []  # C waits: the budget is spent


@pytest.mark.parametrize(("budget", "queued", "granted"), [(3, 0, 3), (3, 1, 2), (3, 3, 0), (3, 5, 0)])
def test_queued_rollouts_count_against_the_budget(budget: int, queued: int, granted: int) -> None:
    ledger = ledger_of(budget, 10.0)
    proven(ledger, A, B, C, D)
    assert ledger.grant(now=0.0, queued=queued) == [A, B, C, D][:granted]
    assert ledger.in_flight == granted


def test_waiting_actors_are_served_first_come_first_served() -> None:
    ledger = ledger_of(1, 10.0)
    proven(ledger, A, B, C)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.delivered(A, 0.0, 0)  # A asks again, behind B and C
    assert ledger.grant(now=0.1, queued=0) == [B]
    ledger.delivered(B, 0.0, 0)
    assert ledger.grant(now=0.2, queued=0) == [C]
    ledger.delivered(C, 0.0, 0)
    assert ledger.grant(now=0.3, queued=0) == [A]


def test_a_repeated_hello_keeps_its_place_and_earns_one_credit() -> None:
    ledger = ledger_of(5, 10.0)
    proven(ledger, A, B)
    ledger.hello(A, 0.0)
    ledger.hello(B, 0.0)
    ledger.hello(A, 0.0)
    ledger.hello(A, 0.0)
    assert ledger.grant(now=0.0, queued=0) == [A, B]
    assert ledger.in_flight == 2


def test_delivered_frees_the_credit() -> None:
    ledger = ledger_of(1, 10.0)
    proven(ledger, A, B)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.delivered(A, 0.0, 0)
    assert ledger.in_flight == 0
    # The rollout now sits in the queue, so it still holds the budget ...
    assert ledger.grant(now=0.1, queued=1) == []
    # ... until the learner trains on it.
    assert ledger.grant(now=0.2, queued=0) == [B]


def test_an_unused_credit_is_reclaimed_after_the_timeout() -> None:
    ledger = ledger_of(1, 5.0)
    proven(ledger, A, B)
    assert ledger.grant(now=100.0, queued=0) == [A]
    assert ledger.grant(now=104.9, queued=0) == []  # A may still be busy
    assert ledger.grant(now=105.0, queued=0) == []  # exactly the timeout: not yet
    assert ledger.grant(now=105.1, queued=0) == [B]  # A is taken to be dead
    assert set(ledger.granted) == {B}
    assert list(ledger.waiting) == []  # A is not re-queued: it says hello if it lives


def test_hello_from_an_actor_holding_a_credit_keeps_the_credit() -> None:
    """The hello may have crossed the credit on the wire: granting again would let the actor
    send two rollouts on one budget slot."""
    ledger = ledger_of(1, 10.0)
    proven(ledger, A, B)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.hello(A, 0.0)
    assert ledger.in_flight == 1 and ledger.holds(A)
    assert list(ledger.waiting) == [B]
    assert ledger.grant(now=0.1, queued=0) == []
    ledger.delivered(A, 0.0, 0)
    assert not ledger.holds(A)
    assert ledger.grant(now=0.2, queued=0) == [B]


def test_a_lost_credit_comes_back_after_the_timeout() -> None:
    ledger = ledger_of(1, 10.0)
    ledger.hello(A, 0.0)
    assert ledger.grant(now=0.0, queued=0) == [A]
    ledger.hello(A, 0.0)  # still waiting: the credit never arrived (the learner's reply was lost)
    assert ledger.grant(now=5.0, queued=0) == []
    assert ledger.grant(now=10.5, queued=0) == [] and ledger.in_flight == 0  # reclaimed
    ledger.hello(A, 0.0)  # the actor greets again while it starves (actors/actor.py)
    assert ledger.grant(now=11.0, queued=0) == [A]


@pytest.mark.parametrize("seed", range(5))
def test_budget_holds_and_the_dead_are_never_served_under_random_traffic(seed: int) -> None:
    """A learner's view of many actors: requests renewed while waiting, restarts, deaths,
    deliveries (some slow enough to lose their credit) and training, at random. Credits out plus
    rollouts kept never pass the budget, and no actor is granted a credit more than the request
    TTL after it died."""
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(1, 5))
    timeouts = CreditTimeouts(request_ttl_s=1.0, min_s=1.0, max_s=3.0)
    ledger = CreditLedger(budget, timeouts)
    actors = [f"actor-{i}".encode() for i in range(int(rng.integers(2, 9)))]
    holding: dict[bytes, float] = {}  # actors holding a credit they will use → granted at
    died_at: dict[bytes, float] = {}
    queued = 0
    served: dict[bytes, int] = {actor: 0 for actor in actors}
    now = 0.0
    for _ in range(600):
        now += float(rng.random())
        for actor in actors:  # the living renew their requests (actors/actor.py)
            if actor not in holding and actor not in died_at:
                ledger.hello(actor, now)
        for actor, since in sorted(holding.items()):
            if now - since > 0.5 * ledger.grant_timeout_s():  # a live actor is rarely that slow
                del holding[actor]
                queued += ledger.delivered(actor, now, queued)
        event = rng.integers(5)
        if event == 0 and holding:  # an actor sends its rollout
            actor = sorted(holding)[rng.integers(len(holding))]
            del holding[actor]
            queued += ledger.delivered(actor, now, queued)
        elif event == 1 and queued:  # the learner trains on one rollout
            queued -= 1
        elif event == 2:  # an actor restarts (or a dead one comes back) and asks for credit
            actor = actors[rng.integers(len(actors))]
            holding.pop(actor, None)
            died_at.pop(actor, None)
            ledger.hello(actor, now)
        elif event == 3 and rng.random() < 0.2:  # an actor dies, credit and all
            actor = actors[rng.integers(len(actors))]
            holding.pop(actor, None)
            died_at.setdefault(actor, now)
        for actor in ledger.grant(now, queued):
            served[actor] += 1
            assert now - died_at.get(actor, now) <= timeouts.request_ttl_s, "a credit went to the long dead"
            if actor not in died_at:
                holding[actor] = now
        assert ledger.in_flight + queued <= budget + PROBATION_SLOTS  # the budget, and newcomers on probation
        assert len(ledger.granted) == ledger.in_flight
        assert not set(ledger.granted) & set(ledger.waiting)
    assert sum(served.values()) > 3 * budget  # the traffic really flowed


def test_a_request_not_renewed_within_its_ttl_is_forgotten_and_a_renewal_keeps_its_place() -> None:
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=1.0, max_s=10.0))
    proven(ledger, A, B, C)
    ledger.hello(A, 0.0)  # A dies here
    ledger.hello(B, 0.0)
    ledger.hello(C, 0.5)
    ledger.hello(B, 0.9)  # B renews: still ahead of C
    assert ledger.grant(now=1.2, queued=0) == [B]  # A's request expired at 1.0
    assert list(ledger.waiting) == [C]


def test_the_grant_timeout_follows_the_slowest_recent_turnaround_within_its_bounds() -> None:
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=1.0, max_s=10.0))
    assert ledger.grant_timeout_s() == 10.0  # nothing came back yet: the most patient
    start = 0.0
    for turnaround, timeout in ((0.01, 1.0), (0.5, 2.0), (5.0, 10.0)):
        ledger.hello(A, start)
        assert ledger.grant(now=start, queued=0) == [A]
        assert ledger.delivered(A, start + turnaround, queued=0)
        assert ledger.grant_timeout_s() == pytest.approx(timeout)
        start += 10.0


def test_a_rollout_whose_credit_was_taken_back_teaches_the_timeout_and_is_kept_if_there_is_room() -> None:
    ledger = CreditLedger(2, CreditTimeouts(request_ttl_s=100.0, min_s=1.0, max_s=2.0))
    ledger.hello(A, 0.0)
    assert ledger.grant(now=0.0, queued=0) == [A]  # a newcomer: on probation
    assert ledger.grant(now=2.5, queued=0) == [] and not ledger.holds(A)  # taken back: A looked dead
    assert ledger.delivered(A, 3.0, queued=1)  # a slow env, not a dead actor: one more fits
    assert ledger.grant_timeout_s() == 2.0  # 4 × 3 s, capped
    proven(ledger, B, at=3.0)
    assert ledger.grant(now=3.0, queued=1) == [A]  # A asked again when it delivered, before B
    assert ledger.grant(now=5.5, queued=1) == [B]  # A's second credit is taken back too, and goes to B
    assert not ledger.delivered(A, 6.0, queued=1)  # now the budget is full: A's late rollout goes


def test_a_partition_does_not_teach_the_ledger_its_length_and_a_slow_actor_still_does() -> None:
    """A rollout held up 26 s by a partition arrives after its credit was taken back: the grant
    timeout at most doubles, where the partition's turnaround would set it to its ceiling for the
    next 32 rollouts. An actor that is slow for real keeps doubling it until its rollouts fit."""
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=100.0, min_s=0.5, max_s=10.0))

    def round_trip(start: float, turnaround: float) -> bool:
        """One credit to A and its rollout `turnaround` later; whether it came before the timeout."""
        ledger.hello(A, start)
        assert ledger.grant(now=start, queued=0) == [A]
        ledger.grant(now=start + turnaround - 1e-3, queued=0)  # the ledger looks just before it comes
        on_time = ledger.holds(A)
        assert ledger.delivered(A, start + turnaround, queued=0)
        return on_time

    assert round_trip(0.0, 0.1) and ledger.grant_timeout_s() == 0.5
    assert not round_trip(1.0, 26.0)  # the partition
    assert ledger.grant_timeout_s() == pytest.approx(1.0)
    timeouts = []
    start = 30.0
    while not round_trip(start, 3.0):  # an actor whose env takes 3 s a rollout
        timeouts.append(ledger.grant_timeout_s())
        start += 10.0
    assert timeouts == [pytest.approx(2.0), pytest.approx(4.0)]


def test_actors_cut_off_together_raise_the_timeout_no_more_than_one_does() -> None:
    """Each late rollout is capped against the timeout its credit missed, not against the one
    its predecessors raised: else N actors of a partition would double it N times."""
    ledger = CreditLedger(3, CreditTimeouts(request_ttl_s=100.0, min_s=0.5, max_s=10.0))
    proven(ledger, A, B, C)
    assert sorted(ledger.grant(now=0.0, queued=0)) == sorted([A, B, C])
    assert ledger.delivered(A, 0.1, queued=0) and ledger.grant_timeout_s() == 0.5
    ledger.grant(now=0.7, queued=1)  # B's and C's credits are taken back: the partition
    assert not ledger.holds(B) and not ledger.holds(C)
    for actor in (B, C):
        ledger.delivered(actor, 26.0, queued=1)
    assert ledger.grant_timeout_s() == pytest.approx(1.0)


def test_a_flood_of_stray_hellos_never_delays_a_live_actor() -> None:
    """500 identities ask once and never again (a script, or actors that died); a live actor asks
    every CREDIT_REQUEST_RENEW_S. It has delivered before, so its next credit comes at the next
    grant: the strays wait for the probation credit beside the budget."""
    timeouts = CreditTimeouts(request_ttl_s=1.0, min_s=1.0, max_s=10.0)
    ledger = CreditLedger(1, timeouts)
    ledger.hello(A, 0.0)  # one rollout came back quickly: the grant timeout is at its floor
    assert ledger.grant(now=0.0, queued=0) == [A]
    assert ledger.delivered(A, 0.01, queued=0)
    assert ledger.grant(now=0.02, queued=0) == [A]
    assert ledger.delivered(A, 0.03, queued=0)
    for i in range(500):
        ledger.hello(f"stray-{i}".encode(), 0.03)
    now, served_at = 0.03, None
    while served_at is None and now < 10.0:
        now += 0.01
        if round(now / 0.01) % 25 == 0:
            ledger.hello(A, now)
        if A in ledger.grant(now, queued=0):
            served_at = now
    assert served_at is not None and served_at - 0.03 <= 0.011


def test_a_stalled_learner_judges_credits_and_requests_by_when_it_last_read_its_socket() -> None:
    """After a long update the rollout that was due, and the renewals, wait unread: not missing."""
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=1.0, max_s=1.0))
    proven(ledger, A, B)
    assert ledger.grant(now=0.0, queued=0) == [A]
    assert ledger.grant(now=5.0, queued=0, read_at=0.5) == []  # stalled since 0.5: A's credit stands
    assert ledger.holds(A) and list(ledger.waiting) == [B]
    assert ledger.delivered(A, 5.0, queued=0)


def test_with_learner_batching_the_budget_follows_the_fleet_within_its_bounds() -> None:
    """One credit per actor heard from (holding one, or asking within the request TTL), never
    fewer than the budget nor more than the most a batch takes; actors gone quiet stop counting."""
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=10.0, max_s=10.0), most=4)
    proven(ledger, A)
    assert ledger.grant(now=0.0, queued=0) == [A]  # one actor: the floor
    proven(ledger, B, C, at=0.1)
    assert ledger.grant(now=0.1, queued=0) == [B, C]  # three actors: three credits
    many = [f"actor-{i}".encode() for i in range(5)]
    proven(ledger, *many, at=0.2)  # newcomers join on probation, one at a time, and count once proven
    assert ledger.grant(now=0.2, queued=0) == many[:1]  # eight actors, but a batch takes at most 4
    assert ledger.in_flight == 4
    # Each delivers; only A and B go on asking. The rollouts wait in the queue (4): no credit yet.
    for actor in (A, B, C, many[0]):
        assert ledger.delivered(actor, 0.3, queued=0)
    assert ledger.grant(now=0.3, queued=4) == []
    for t in (0.9, 1.5, 2.1):
        ledger.hello(A, t)
        ledger.hello(B, t)
    # The queue was trained on; only A and B were heard from within the TTL: two credits.
    assert ledger.grant(now=2.1, queued=0) == [A, B]


def test_without_learner_batching_the_budget_stays_fixed_however_many_ask() -> None:
    ledger = CreditLedger(2, CreditTimeouts(request_ttl_s=1.0, min_s=10.0, max_s=10.0))
    proven(ledger, A, B, C, D)
    assert ledger.grant(now=0.0, queued=0) == [A, B]


def test_newcomers_join_on_probation_beside_the_budget_and_idle_ones_one_at_a_time() -> None:
    ledger = ledger_of(1, 10.0)
    proven(ledger, A)
    for actor in (B, C, D):
        ledger.hello(actor, 0.0)
    assert ledger.grant(now=0.0, queued=0) == [A, B, C, D]  # A within the budget, the newcomers on probation
    assert ledger.in_flight == 4 and ledger.in_budget == 1 and ledger.probation == {B, C, D}
    assert ledger.delivered(B, 0.2, queued=0)  # B is proven now, and asks again
    assert ledger.grant(now=11.0, queued=1) == []  # C's and D's credits are taken back unused: idle
    assert ledger.idle == {C: None, D: None} and not ledger.probation
    for actor in (C, D):
        ledger.hello(actor, 11.0)
    assert ledger.grant(now=11.0, queued=1) == [C]  # idle newcomers: one at a time
    assert ledger.idle_requests() == 1  # D asks again, after a credit it did not use


def test_identities_that_never_deliver_cost_the_proven_fleet_nothing_and_are_counted() -> None:
    """200 identities with the fleet's key, each a new name, renew their requests every 0.25 s and
    never send a rollout; A, a proven actor, delivers 10 ms after each credit and the learner trains
    on it at once. A gets as many credits as it would alone; each stray gets one probation credit,
    taken back unused after the grant timeout, and then waits behind any newcomer; all are counted."""

    def run(strays: int) -> tuple[int, CreditLedger]:
        ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=0.5, max_s=10.0))
        proven(ledger, A)
        credits, due_at, now = 0, None, 0.0
        while now < 20.0:
            now = round(now + 0.01, 2)
            if round(now * 100) % 25 == 0:
                for i in range(strays):
                    ledger.hello(f"stray-{i}".encode(), now, name=f"stray-{i}", key="actor:*")
            if due_at is not None and now >= due_at:
                assert ledger.delivered(A, now, queued=0)
                due_at = None
            for actor in ledger.grant(now, queued=0):
                if actor == A:
                    credits, due_at = credits + 1, now + 0.01
        return credits, ledger

    alone, _ = run(0)
    crowded, ledger = run(200)
    assert crowded == alone > 900
    assert len(ledger.idle) == 200  # a probation credit each, PROBATION_SLOTS at a time, then idle
    assert ledger.idle_requests() == 199  # all ask again but the one on probation now


def test_a_name_holds_one_request_and_keys_are_served_in_turn() -> None:
    ledger = ledger_of(1, 10.0)
    ledger.hello(b"old", 0.0, name="actor-7", key="actor:actor-7")
    ledger.hello(b"new", 0.1, name="actor-7", key="actor:actor-7")  # actor-7 restarted
    assert ledger.waiting == [b"new"]
    ledger = ledger_of(1, 10.0)
    proven(ledger, A, B, C)
    for actor, key in ((A, "actor:*"), (B, "actor:*"), (C, "actor:actor-3")):
        ledger.hello(actor, 1.0, key=key)
    served = []
    for t in (1.0, 1.1, 1.2):
        (actor,) = ledger.grant(now=t, queued=0)
        served.append(actor)
        ledger.delivered(actor, t, queued=0)
        ledger.hello(actor, t, key={A: "actor:*", B: "actor:*", C: "actor:actor-3"}[actor])
    assert served == [A, C, B]  # the fleet's key, then the other key before the fleet's again


def test_a_fleet_of_newcomers_joins_in_one_round_up_to_the_probation_slots() -> None:
    ledger = CreditLedger(1, CreditTimeouts(request_ttl_s=1.0, min_s=10.0, max_s=10.0))
    fleet = [f"actor-{i}".encode() for i in range(PROBATION_SLOTS + 6)]
    for actor in fleet:
        ledger.hello(actor, 0.0)
    # beside the budget, and in the budget's own room while no proven actor uses it
    assert ledger.grant(now=0.0, queued=0) == fleet[: PROBATION_SLOTS + 1] and ledger.in_budget == 0
    assert ledger.grant(now=0.1, queued=1) == []  # one rollout queued: no room left
