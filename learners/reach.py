"""Where a learner rank is reached (its advertised address) and where it reaches rank 0 (the
rendezvous), found rather than guessed, and said out loud when they cannot work (issue 40).

Across hosts, each of these is otherwise a silent hang: an advertised 127.0.0.1 sends actors to
their own loopback (0 env steps, forever); a rank without `--master-addr` retries its own loopback
for ten minutes. So the advertised address defaults to the one this host reaches the coordinator
from, rank 0's to that, and the other ranks' rendezvous to rank 0's registered host; and a rank
whose rendezvous does not answer says so within seconds, while it keeps trying.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable

import zmq

from rlmq.common import transport, wire
from rlmq.common.addresses import AUTO, endpoint_host, interface_of, is_loopback, source_address
from rlmq.common.service import StopFlag

log = logging.getLogger("rlmq.learner")
MASTER_PROBE_S = 2.0  # each try to reach rank 0's rendezvous gives up after this
MASTER_WARN_EVERY_S = 30.0  # after the first warning, how often the wait is logged again


def advertised_address(advertise_host: str, coordinator: str) -> str:
    """The address actors and peer ranks are told to reach this learner at: `advertise_host`, or
    with "auto" the one this host's routes use towards the coordinator. Logs a warning where it
    cannot work for peers on other hosts."""
    coordinator_host = endpoint_host(coordinator)
    if advertise_host != AUTO:
        if is_loopback(advertise_host) and coordinator_host and not is_loopback(coordinator_host):
            log.warning(
                "--advertise-host %s is this host's loopback, but the coordinator is at %s: actors on other "
                "hosts cannot reach this learner (leave --advertise-host at auto, or give an address of this "
                "host they reach)",
                advertise_host,
                coordinator_host,
            )
        elif _is_address(advertise_host) and interface_of(advertise_host) is None:
            log.warning(
                "--advertise-host %s is not an address of this host's interfaces: actors will be sent it "
                "(right only behind a NAT or a proxy)",
                advertise_host,
            )
        return advertise_host
    found = source_address(coordinator_host) if coordinator_host else "127.0.0.1"
    if is_loopback(found) and coordinator_host and not is_loopback(coordinator_host):
        log.warning(
            "no route from this host to the coordinator's %s: advertising %s, which actors on other hosts "
            "cannot reach (give --advertise-host)",
            coordinator_host,
            found,
        )
    return found


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


def register(
    control: zmq.Socket,
    hello: wire.Hello,
    master_addr: str,
    stop: StopFlag,
    on_reject: Callable[[wire.WireError], None],
) -> wire.Assign | None:
    """Hello → Assign; with `--master-addr auto` on a rank other than 0, until the coordinator
    knows where rank 0 is. None if stopped first."""
    waiting_logged = False
    while (assign := transport.request_assignment(control, hello, stop, on_reject=on_reject)) is not None:
        if hello.rank == 0 or master_addr != AUTO or assign.master_host:
            return assign
        if not waiting_logged:
            log.info("waiting for rank 0 to register with the coordinator: its address is the rendezvous")
            waiting_logged = True
        stop.wait(1.0)
    return None


def master_address(master_addr: str, rank: int, reached_at: str, assign: wire.Assign) -> str:
    """The rendezvous host: `master_addr`, or with "auto" rank 0's advertised address."""
    if master_addr != AUTO:
        return master_addr
    return reached_at if rank == 0 else assign.master_host


def await_master(host: str, port: int, stop: StopFlag) -> bool:
    """Wait until rank 0's rendezvous at host:port accepts a connection (False: stopped first).
    torch's own store client retries silently for its whole timeout; this says within seconds
    that it cannot get there, and keeps saying so now and then."""
    started = time.monotonic()
    warned_at = 0.0
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=MASTER_PROBE_S):
                if warned_at:
                    log.info("rank 0's rendezvous at %s:%d answers now", host, port)
                return True
        except OSError as exc:
            now = time.monotonic()
            due = now - warned_at >= MASTER_WARN_EVERY_S if warned_at else now - started >= MASTER_PROBE_S
            if due:
                log.warning(
                    "rank 0's rendezvous at %s:%d does not answer (%s) after %.0f s: is rank 0 running, and "
                    "is %s the address this host reaches it at (--master-addr)?",
                    host,
                    port,
                    exc.strerror or exc,
                    now - started,
                    host,
                )
                warned_at = now
            stop.wait(0.2)
    return False
