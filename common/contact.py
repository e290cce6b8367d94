"""Whether a service is in contact with a peer it connects to, from the socket's own monitor:
logged when contact is lost and when it is back, with how long it was gone (issue 40).

Across hosts, without it an actor cut off by a partition says nothing: its env steps simply stop.
With ZMTP heartbeats (transport.py) a dead connection is dropped within seconds, the monitor says
so, and the log line names the peer; the handshake of the next connection says it is back.
"""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from rlmq.common import transport

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class Contact:
    def __init__(self, sock: zmq.Socket, peer: str, log: logging.Logger) -> None:
        """Watch `sock` (before it connects, so that the first handshake is seen); `peer` names
        what it connects to in the log lines."""
        self.monitor = sock.get_monitor_socket(EVENTS)
        self.peer, self.log = peer, log
        self.connected = False
        self.lost_at: float | None = None  # monotonic time contact was lost; None: in contact or never had it

    def check(self) -> bool:
        """Read the socket's events without blocking, log what changed; whether in contact."""
        while transport.readable(self.monitor):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED and self.connected:
                self.connected, self.lost_at = False, time.monotonic()
                self.log.warning("lost contact with %s; reconnecting", self.peer)
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not self.connected:
                self.connected = True
                if self.lost_at is not None:
                    self.log.info("in contact with %s again, after %.1f s", self.peer, time.monotonic() - self.lost_at)
                    self.lost_at = None
        return self.connected

    def close(self) -> None:
        self.monitor.close()
