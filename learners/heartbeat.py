"""A learner rank's heartbeat to the coordinator, from a thread of its own.

A rank that waits in a collective for a peer (or computes a long update) still beats, and says how
long it has been in the synchronised part of its iteration; a stopped or hung process does not
beat at all. So the coordinator can tell the ranks that wait from the one that holds them up, and
name it well before the collective times out (coordinator/stragglers.py).
"""

from __future__ import annotations

import threading
import time

import zmq

from rlmq.common import transport, wire
from rlmq.common.security import Credentials


class HeartbeatThread:
    def __init__(
        self,
        ctx: zmq.Context,
        coordinator: str,
        identity: bytes,
        name: str,
        rank: int,
        credentials: Credentials | None = None,
    ) -> None:
        self.ctx, self.coordinator, self.identity, self.name, self.rank = ctx, coordinator, identity, name, rank
        self.credentials = credentials or Credentials()
        self.iteration = 0
        self.entered = 0.0  # monotonic time the synchronised part began; 0: not in it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def enter(self) -> None:
        """The rank starts waiting for its peers (rendezvous, agreement, update)."""
        self.entered = time.monotonic()

    def leave(self) -> None:
        self.entered = 0.0
        self.iteration += 1

    def _run(self) -> None:
        # Its own socket, made, used and closed in this thread: ZeroMQ sockets are not shared.
        sock = transport.make_socket(self.ctx, zmq.DEALER, identity=self.identity)
        self.credentials.client(sock)
        sock.connect(self.coordinator)
        try:
            while True:
                entered = self.entered
                waiting = time.monotonic() - entered if entered else 0.0
                transport.send(sock, wire.LearnerHeartbeat(self.name, self.rank, self.iteration, waiting))
                if self._stop.wait(wire.HEARTBEAT_PERIOD_S):
                    return
        finally:
            sock.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2 * wire.HEARTBEAT_PERIOD_S)
