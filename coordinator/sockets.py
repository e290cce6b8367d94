"""The coordinator's sockets and their security: one idea, so the service reads only the wire.

A ROUTER every actor and learner rank talks to (register, reports, weights) and a PUB for its
broadcast (stop, population decisions), each bound where `rlmq up` or the user said (a listening
socket `rlmq up` kept open across a restart may be handed down). On a secure run both are CURVE
servers and the gatekeeper checks who connects.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from rlmq.common import transport
from rlmq.common.config import CoordinatorConfig
from rlmq.common.security import Credentials


class CoordinatorSockets:
    def __init__(self, cfg: CoordinatorConfig, on_refusal: Callable[[str, bool], None]) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        credentials = Credentials.load(cfg.keys_dir, None, serves=True)
        self.gatekeeper = credentials.gatekeeper(self.ctx, on_refusal)
        self.control = transport.make_socket(self.ctx, zmq.ROUTER, hwm=1000)
        credentials.server(self.control)
        self.control_endpoint = transport.bind(self.control, cfg.control_bind, cfg.control_fd)
        self.broadcast = transport.make_socket(self.ctx, zmq.PUB, hwm=100)
        credentials.server(self.broadcast)
        if self.gatekeeper is not None:
            self.gatekeeper.watch(self.control, self.broadcast)
        self.broadcast_endpoint = transport.bind(self.broadcast, cfg.broadcast_bind, cfg.broadcast_fd)

    @property
    def secure(self) -> bool:
        """Whether every sender is checked: each speaks only as itself."""
        return self.gatekeeper is not None

    def close(self) -> None:
        self.control.close()
        self.broadcast.close()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
