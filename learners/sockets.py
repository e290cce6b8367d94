"""A learner rank's sockets and their security: one idea, so the learner's loop reads only the wire.

A DEALER to the coordinator (register, reports, weights), the ROUTER that actors send experience to
(bound on TCP or, for actors on this host only, IPC; a listening socket `rlmq up` kept open may be
handed down), and on rank 0 a SUB to the coordinator's broadcast (stop, population decisions). On
a secure run each is a CURVE client or server, and the gatekeeper checks who connects to the
ROUTER.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import zmq

from rlmq.common import transport, wire
from rlmq.common.config import LearnerConfig
from rlmq.common.security import Credentials
from rlmq.learners import reach


class LearnerSockets:
    def __init__(self, cfg: LearnerConfig, name: str, on_refusal: Callable[[str, bool], None]) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.credentials = Credentials.load(cfg.keys_dir, name, serves=True)
        self.gatekeeper = self.credentials.gatekeeper(self.ctx, on_refusal)
        self.identity = f"{name}-{os.getpid()}".encode()  # the heartbeat's socket takes it with a suffix
        self.control = transport.make_socket(self.ctx, zmq.DEALER, identity=self.identity)
        self.credentials.client(self.control)
        self.control.connect(cfg.coordinator)
        self.reached_at = reach.advertised_address(cfg.advertise_host, cfg.coordinator)
        self.experience = transport.make_socket(self.ctx, zmq.ROUTER, hwm=1000)
        self.credentials.server(self.experience)
        if self.gatekeeper is not None:
            self.gatekeeper.watch(self.experience)
        if cfg.experience_ipc:  # actors on this host only
            self.endpoint = transport.bind(self.experience, f"ipc://{cfg.experience_ipc}", cfg.experience_fd)
        else:
            port = transport.bind(
                self.experience, f"tcp://{cfg.bind_host}:{cfg.experience_port}", cfg.experience_fd
            ).rsplit(":", 1)[1]
            host = f"[{self.reached_at}]" if ":" in self.reached_at else self.reached_at  # IPv6
            self.endpoint = f"tcp://{host}:{port}"
        self.directives = transport.make_socket(self.ctx, zmq.SUB)
        self.credentials.client(self.directives)
        if cfg.rank == 0:
            self.directives.setsockopt(zmq.SUBSCRIBE, wire.DIRECTIVE_TOPIC)
            self.directives.setsockopt(zmq.SUBSCRIBE, wire.DECISION_TOPIC)
            self.directives.connect(cfg.broadcast)

    @property
    def secure(self) -> bool:
        """Whether actors are checked: each sends only as itself."""
        return self.gatekeeper is not None

    def close(self) -> None:
        for sock in (self.control, self.experience, self.directives):
            sock.close()
        if self.gatekeeper is not None:
            self.gatekeeper.stop()
