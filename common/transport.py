"""ZeroMQ sockets with the house defaults: bounded queues, no linger, polling with timeouts,
heartbeats.

Every socket has a high-water mark (a full queue blocks or drops instead of growing memory), a
short linger (closing never hangs a shutdown) and a maximum message size (a peer that announces a
larger message is disconnected before any of it is buffered). Receiving always takes a timeout.

Connections carry ZMTP heartbeats, and a connect attempt gives up after CONNECT_TIMEOUT_MS: across
hosts, a peer cut off by a partition is then dropped within HEARTBEAT_TIMEOUT_MS and reached again
within about CONNECT_TIMEOUT_MS of the heal, where TCP alone notices nothing and comes back only on
its own retransmission backoff (benchmarks/LOG.md §16).

A broadcast's two ends (PUB, SUB) take TCP keepalive instead of ZMTP heartbeats. Its messages are
resent every coordinator tick, so a subscriber busy for seconds (a learner's update) finds its
queue full and stops reading the connection; heartbeats then drop that healthy connection, and
libzmq aborts the process when the subscriber reads again (zeromq/libzmq#3937; PBT runs' learners
died so, benchmarks/LOG.md §33). The kernel answers keepalive probes whether or not the process
reads: only a peer that is gone or cut off is dropped.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import zmq

from rlmq.common import wire

DEFAULT_HWM = 16
LINGER_MS = 200
HEARTBEAT_IVL_MS = 1000  # a PING this often on a quiet connection ...
# ... and the connection is dropped (and redialled) when no whole message came back this long. libzmq
# counts whole messages only (zeromq/libzmq#2709), so this bounds how long one message may take to
# cross: 10 s is a 64 MiB message at 54 Mbit/s.
HEARTBEAT_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 1000  # a connect attempt unanswered this long is abandoned and tried again
# A broadcast's connection is dropped after 1 s idle plus 9 probes a second apart go unanswered:
# about HEARTBEAT_TIMEOUT_MS, as the other sockets.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 1, 1, 9
BROADCAST_KINDS = (zmq.PUB, zmq.SUB)


def make_socket(ctx: zmq.Context, kind: int, *, hwm: int = DEFAULT_HWM, identity: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_MESSAGE_BYTES)
    if kind in BROADCAST_KINDS:
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_PROBES)
    else:
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if kind == zmq.ROUTER:
        # A peer that redials after a partition comes with its old identity while this side may
        # still hold the old connection: the new one takes over, where ZeroMQ's default ignores it
        # until the old one dies.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock


def bind(sock: zmq.Socket, endpoint: str, fd: int = -1) -> str:
    """Bind; a tcp port of 0 picks a free one. Returns the endpoint actually bound. `fd`: a TCP (or
    Unix, for ipc://) socket already listening at `endpoint`, handed down by a parent that holds
    the address for us (`rlmq up`), so that no other socket can take it between its choice and our
    bind, and what connects while we restart waits in its backlog."""
    if fd >= 0:
        sock.setsockopt(zmq.USE_FD, fd)
    elif endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        host = endpoint[len("tcp://") : -len(":0")]
        port = sock.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"
    sock.bind(endpoint)
    bound = sock.getsockopt(zmq.LAST_ENDPOINT)
    return bound.decode() if isinstance(bound, bytes) else str(bound)


def send(sock: zmq.Socket, message: wire.Message) -> bool:
    """Send without blocking; False (message dropped) when the peer's queue is full or absent.

    For control traffic (reports, weights, replies), where the next message supersedes this one
    and blocking could trap a shutdown. Experience is paced by credits instead (learners/credits.py).
    """
    return send_encoded(sock, wire.encode(message))


def send_encoded(sock: zmq.Socket, encoded: bytes) -> bool:
    """`send` for a message encoded already."""
    try:
        sock.send(encoded, flags=zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False


def readable(sock: zmq.Socket) -> bool:
    """Whether a message is waiting, without blocking: one getsockopt, where `sock.poll(0)` builds
    and registers a Poller on every call (an actor asks several times per rollout). The options as
    plain ints: with pyzmq's enum members each call converts them
    (benchmarks/LOG.md §12, learner ingest)."""
    return bool(cast(int, sock.getsockopt(_EVENTS)) & _POLLIN)


def receive(sock: zmq.Socket) -> list[zmq.Frame] | None:
    """The next message's parts without blocking, or None when none is waiting: one call per part,
    where `readable` asks the socket once more per message and `recv_multipart` once more per part
    (a learner reads every rollout so; benchmarks/LOG.md §12). A message arrives whole, so the
    parts after the first are there."""
    try:
        parts = [sock.recv(_NOBLOCK, copy=False)]
    except zmq.Again:
        return None
    while parts[-1].more:
        parts.append(sock.recv(copy=False))
    return parts


_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a server that starts later and cannot bind port 0
    itself. Drawn below the kernel's ephemeral range where there is one: ports for bind(0) and
    outgoing connections come from that range, so no socket is handed ours by chance before our
    server binds it (a coordinator's /metrics port once went to another socket in that gap)."""
    low = _ephemeral_range_start()
    if low is not None and low > 2048:
        draw = random.SystemRandom()
        for _ in range(100):
            port = draw.randrange(max(1024, low - 16384), low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:  # in use, or a listener elsewhere on this host
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_range_start() -> int | None:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux
        return None


def request_assignment(
    control: zmq.Socket,
    hello: wire.Hello,
    should_stop: Callable[[], bool],
    resend_s: float = 2.0,
    on_reject: Callable[[wire.WireError], None] | None = None,
) -> wire.Assign | None:
    """Say Hello until the coordinator answers with an Assign (None if told to stop first).

    Resending covers a coordinator that starts after us or restarts; the coordinator answers each
    Hello, so a late reply to an earlier one is as good as any.
    """
    send(control, hello)
    last_sent = time.monotonic()
    while not should_stop():
        if control.poll(100, zmq.POLLIN):
            try:
                message = wire.decode(control.recv())
            except wire.WireError as exc:
                if on_reject is not None:
                    on_reject(exc)
                continue
            if isinstance(message, wire.Assign):
                return message
        elif time.monotonic() - last_sent > resend_s:
            send(control, hello)
            last_sent = time.monotonic()
    return None
