"""Which learner rank holds the world up, named before the collective it blocks times out.

Every learner rank sends a heartbeat from a thread of its own (wire.LearnerHeartbeat), so a rank
that waits in a collective for a peer still beats, and says how long it has waited. A rank is
*behind* when it is silent (stopped, hung or dead: SIGSTOP stops every thread), or when the others
have waited for it in a collective for WAITED_S while it is elsewhere. Pure: the coordinator feeds
it the latest pulses and logs, counts and records what it returns.
"""

from __future__ import annotations

from typing import NamedTuple

from rlmq.common import wire

SILENT_S = 3 * wire.HEARTBEAT_PERIOD_S  # three missed heartbeats
WAITED_S = 5.0  # a rank's synchronised part (agreement and update) takes milliseconds to seconds


class Pulse(NamedTuple):
    heard: float  # monotonic seconds, on the coordinator's clock
    iteration: int
    waiting_s: float  # in the synchronised part when it beat; 0: not there
    since: float = 0.0  # when it began beating without a gap of SILENT_S (its process resumed, or started)


def hung(pulses: dict[int, Pulse], now: float) -> list[int]:
    """The silent ranks, where a rank that beats waits for them in a collective: the world cannot go
    on without them, and `rlmq up` restarts it. A world silent as a whole is paused (every rank
    stopped, a host suspended), not hung: when it resumes, its collectives complete."""
    silent = sorted(rank for rank, p in pulses.items() if now - p.heard > SILENT_S)
    # A rank that waits and has beaten for SILENT_S without a gap: not one that was stopped with the
    # others and has just resumed ahead of them (they beat again within a heartbeat).
    waiting = any(
        now - p.heard <= SILENT_S and p.waiting_s > 0 and p.heard - p.since >= SILENT_S for p in pulses.values()
    )
    return silent if waiting else []


def behind(pulses: dict[int, Pulse], world_size: int, now: float) -> dict[int, str]:
    """rank → why it is behind, for each rank that holds the world up now."""
    silent = {
        rank: f"no heartbeat for {now - p.heard:.1f} s (stopped, hung or dead)"
        for rank, p in pulses.items()
        if now - p.heard > SILENT_S
    }
    waited = {rank: p.waiting_s + now - p.heard for rank, p in pulses.items() if rank not in silent and p.waiting_s > 0}
    waiters = sorted(rank for rank, seconds in waited.items() if seconds >= WAITED_S)
    if not waiters:
        return silent
    why = f"rank(s) {', '.join(map(str, waiters))} waited {max(waited.values()):.1f} s for it in a collective"
    late = {
        rank: f"{why}; it is at iteration {p.iteration}, not in a collective"
        for rank, p in pulses.items()
        if rank not in silent and rank not in waited
    }
    missing = {rank: f"{why}; it never sent a heartbeat" for rank in range(world_size) if rank not in pulses}
    return {**silent, **late, **missing}
