"""transport.py against real ZeroMQ sockets."""

from __future__ import annotations

import time

import zmq

from rlmq.common import transport, wire


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
        identity, frame = server.recv_multipart()
        assert wire.decode(frame) == wire.Credit(2)
        assert not transport.readable(server)  # nothing is left once it has been read
        server.send_multipart([identity, wire.encode(wire.Credit(3))])
        assert client.poll(10_000, zmq.POLLIN)
        assert transport.readable(client)
        assert wire.decode(client.recv()) == wire.Credit(3)
        assert not transport.readable(client)
    finally:
        client.close()
        server.close()
