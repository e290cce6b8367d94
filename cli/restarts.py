"""`rlmq learner --restart`: one learner rank, started again whenever its world is lost.

Under `rlmq up` the supervisor restarts the whole learner world when a rank dies. A rank started
on its own has no supervisor: when a peer rank dies or its host is cut off longer than the
collective timeout, every rank exits (`EXIT_WORLD_LOST`) and, without this, the run would sit at 0
env steps/s in state "running" for good. With it, each rank is a child process started again after a
pause; the new processes meet in a new world at rank 0's rendezvous and resume from their newest
checkpoint (`--checkpoint-dir`), as a world restarted by `rlmq up` does. A child killed by a
signal it was not passed is started again too; any other exit ends the loop with the child's code.
Bounded: at most MAX_RESTARTS in RESTART_WINDOW_S, then it gives up.
Signals: the first is passed on to the child (a warm stop), the second ends both at once. Under
systemd, `KillMode=mixed` leaves the passing on to the loop.
"""

from __future__ import annotations

import collections
import logging
import signal
import subprocess
import sys
import time

from rlmq.common.service import EXIT_FAILED, EXIT_OK, EXIT_WORLD_LOST, StopFlag, die_with_parent

log = logging.getLogger("rlmq.restarts")
PAUSE_S = 1.0  # between a lost world and the next start: the old processes of the other ranks go first
MAX_RESTARTS = 20
RESTART_WINDOW_S = 600.0


def restarting(args: list[str], stop: StopFlag) -> int:
    """Run `rlmq learner ARGS` as a child until it exits for a reason other than a lost world or a
    signal it was not passed; its exit code (EXIT_OK after a stop)."""
    starts: collections.deque[float] = collections.deque()
    while True:
        # A session of its own: a terminal's Ctrl-C reaches the loop alone, which passes one
        # SIGTERM on (two would make the child stop at once, without its final checkpoint).
        child = subprocess.Popen(
            [sys.executable, "-m", "rlmq.cli", "learner", *args], preexec_fn=die_with_parent, start_new_session=True
        )
        passed_on = False
        while (code := child.poll()) is None:
            if stop.is_set() and not passed_on:
                child.terminate()
                passed_on = True
            time.sleep(0.1)
        if stop.is_set():
            # -SIGTERM: the stop reached the child where only the default action was left (torch's
            # rendezvous, its interpreter's shutdown), with nothing to save; a lost world, likewise.
            return EXIT_OK if code in (EXIT_OK, EXIT_WORLD_LOST, -signal.SIGTERM) else code
        if not (code == EXIT_WORLD_LOST or code < 0):  # < 0: killed (the OOM killer, say)
            return code
        now = time.monotonic()
        starts.append(now)
        while starts and now - starts[0] > RESTART_WINDOW_S:
            starts.popleft()
        if len(starts) > MAX_RESTARTS:
            log.error("the learner world was lost %d times in %.0f s: giving up", len(starts), RESTART_WINDOW_S)
            return EXIT_FAILED
        why = "the learner world was lost" if code == EXIT_WORLD_LOST else f"the rank was killed (signal {-code})"
        log.warning("%s: starting this rank again to join a new world", why)
        if stop.wait(PAUSE_S):
            return EXIT_OK
