"""transport.py against real ZeroMQ sockets."""

from __future__ import annotations

import logging
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
