"""transport.py against real ZeroMQ sockets."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from rlmq.common import transport, wire
from rlmq.common.service import RejectLog


def test_readable_says_whether_a_message_waits() -> None:
    ctx = zmq.Context.instance()
    server = transport.make_socket(ctx, zmq.ROUTER)
    client = transport.make_socket(ctx, zmq.DEALER)
    try:
        client.connect(transport.bind(server, "tcp://127.0.0.1:0"))
        assert not transport.readable(client) and not transport.readable(server)
        transport.send(client, wire.Credit(2))
        deadline = time.monotonic() + 10
        while not transport.readable(server):  # the I/O thread delivers it a moment later
            assert time.monotonic() < deadline, "the message never became readable"
            time.sleep(0.001)
        identity, encoded = server.recv_multipart()
        assert wire.decode(encoded) == wire.Credit(2)
        assert not transport.readable(server)  # nothing is left once it has been read
        server.send_multipart([identity, wire.encode(wire.Credit(3))])
        assert client.poll(10_000, zmq.POLLIN)
        assert transport.readable(client)
        assert wire.decode(client.recv()) == wire.Credit(3)
        assert not transport.readable(client)
    finally:
        client.close()
        server.close()


def test_receive_takes_each_message_whole_and_none_when_none_waits() -> None:
    ctx = zmq.Context.instance()
    server = transport.make_socket(ctx, zmq.ROUTER)
    client = transport.make_socket(ctx, zmq.DEALER, identity=b"actor-7")
    try:
        client.connect(transport.bind(server, "tcp://127.0.0.1:0"))
        assert transport.receive(server) is None
        client.send_multipart([b"one", b"two"])
        client.send(b"three")
        assert server.poll(10_000, zmq.POLLIN)
        first = transport.receive(server)
        deadline = time.monotonic() + 10
        while (second := transport.receive(server)) is None:  # the I/O thread delivers it a moment later
            assert time.monotonic() < deadline, "the second message never came"
            time.sleep(0.001)
        assert first is not None and [f.bytes for f in first] == [b"actor-7", b"one", b"two"]
        assert [f.bytes for f in second] == [b"actor-7", b"three"]
        assert transport.receive(server) is None
    finally:
        client.close()
        server.close()


# A subscriber busy past the heartbeat timeout while its broadcast keeps coming, in a process of its
# own: libzmq's abort (zeromq/libzmq#3937) would take pytest with it.
STALLED_SUBSCRIBER = """
import sys, threading, time
import zmq
from rlmq.common import transport

ctx = zmq.Context.instance()
pub, sub = transport.make_socket(ctx, zmq.PUB, hwm=100), transport.make_socket(ctx, zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"pbt.")
sub.connect(transport.bind(pub, "tcp://127.0.0.1:0"))
sent = 0

def publish() -> None:  # as the coordinator resends a decision each tick
    global sent
    while True:
        sent += 1
        pub.send_multipart([b"pbt.", str(sent).encode()])
        time.sleep(0.05)

threading.Thread(target=publish, daemon=True).start()
time.sleep(float(sys.argv[1]))  # the learner's long update: its queue fills, reading stops
got = []
while sub.poll(1000):
    got.append(int(sub.recv_multipart()[1]))
    if got[-1] > sent - 5:  # caught up with what is published now
        break
print(len(got), got[-1], sent, flush=True)
"""


def test_a_subscriber_busy_past_the_heartbeat_timeout_lives_and_reads_the_broadcast_on() -> None:
    stall_s = transport.HEARTBEAT_TIMEOUT_MS / 1000 + 2
    done = subprocess.run(
        [sys.executable, "-c", STALLED_SUBSCRIBER, str(stall_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"the subscriber died ({done.returncode}): {done.stderr[-500:]}"
    count, last, sent = map(int, done.stdout.split())
    # The queue's worth from before the stall, then what is published now: the connection held.
    assert count > transport.DEFAULT_HWM and last > sent - 5, done.stdout


def test_a_frame_over_the_wire_limit_is_refused_before_it_is_buffered() -> None:
    """The receiver caps message size: a peer announcing a larger message is disconnected, and the
    service never holds it (nor the half of it a slow peer sends)."""
    ctx = zmq.Context.instance()
    server = transport.make_socket(ctx, zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    monitor = server.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    big, small = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    try:
        big.connect(f"tcp://127.0.0.1:{port}")
        big.send(b"x" * (wire.MAX_MESSAGE_BYTES + 1))
        assert monitor.poll(10_000), "the peer that sent an oversized message is still connected"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        assert not server.poll(0), "an oversized message got through"
        small.connect(f"tcp://127.0.0.1:{port}")
        small.send(b"fine")
        assert server.poll(5000) and server.recv_multipart()[-1] == b"fine"
    finally:
        server.disable_monitor()
        for sock in (monitor, server, big, small):
            sock.close(linger=0)


def test_rejected_messages_are_logged_by_reason_and_size_with_a_short_detail_once_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test-rejects")
    rejects = RejectLog(log, period_s=0.5)
    content = "A" * 16_000_000  # what a hostile message's error might quote
    with caplog.at_level(logging.WARNING, logger="test-rejects"):
        for _ in range(5):
            rejects("garbage", content, size=16_000_000, sender=b"\x00peer")
        rejects("bad_shape", "obs (9, 4, 5)")
        assert len(caplog.records) == 2, "one line per reason per period"
        time.sleep(0.6)
        rejects("garbage", "again")
    first, _, after = (r.getMessage() for r in caplog.records)
    assert "garbage, 16000000 bytes from 0070656572" in first
    assert "A" * RejectLog.DETAIL_CHARS in first and "A" * (RejectLog.DETAIL_CHARS + 1) not in first
    assert "garbage" in after and "again (and 4 more of this reason in the last 0.5 s)" in after
