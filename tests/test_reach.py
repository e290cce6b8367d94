"""What lets services on several hosts find one another without being told, tested on this host:
addresses and interfaces, the rendezvous probe, contact logging over real ZeroMQ sockets, key
bundles, and a learner waiting for its world that a SIGTERM ends (tests/test_hosts.py runs it all
across simulated hosts)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from rlmq.common import transport
from rlmq.common.addresses import endpoint_host, interface_of, is_loopback, loopback_interface, source_address
from rlmq.common.contact import Contact
from rlmq.common.security import key_files
from rlmq.common.service import StopFlag
from rlmq.common.transport import free_port
from rlmq.learners.reach import advertised_address, await_master


def test_endpoint_hosts_and_the_addresses_a_host_is_reached_at() -> None:
    assert endpoint_host("tcp://10.0.0.7:5555") == "10.0.0.7"
    assert endpoint_host("tcp://[fd00::1]:5555") == "fd00::1"
    assert endpoint_host("ipc:///tmp/x.sock") == ""
    assert source_address("127.0.0.1") == "127.0.0.1" and is_loopback(source_address("127.0.0.1"))
    assert interface_of("127.0.0.1") == loopback_interface()
    assert interface_of("203.0.113.9") is None  # TEST-NET-3: no interface here holds it
    # A coordinator on this host: the learner advertises loopback; one given explicitly is kept.
    assert advertised_address("auto", "tcp://127.0.0.1:5555") == "127.0.0.1"
    assert advertised_address("auto", "ipc:///tmp/c.sock") == "127.0.0.1"
    assert advertised_address("10.9.9.9", "tcp://127.0.0.1:5555") == "10.9.9.9"


def test_a_loopback_advertised_to_a_coordinator_elsewhere_is_called_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "rlmq.learner"):
        assert advertised_address("127.0.0.1", "tcp://203.0.113.9:5555") == "127.0.0.1"
    assert "actors on other hosts cannot reach this learner" in caplog.text


def test_a_rendezvous_that_does_not_answer_is_said_within_seconds_and_a_stop_ends_the_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, stop = free_port(), StopFlag()
    started = time.monotonic()  # before the timer: it may fire 3.0 s after its own start, a little sooner
    threading.Timer(3.0, stop.set).start()
    with caplog.at_level(logging.WARNING, "rlmq.learner"):
        assert not await_master("127.0.0.1", port, stop)
    assert 3.0 <= time.monotonic() - started < 4.0
    assert len(caplog.records) == 1  # said once within the 3 s, not at every try
    assert f"rendezvous at 127.0.0.1:{port} does not answer" in caplog.text and "--master-addr" in caplog.text
    with transport.socket.create_server(("127.0.0.1", port)):  # now it answers, at once
        assert await_master("127.0.0.1", port, StopFlag())


def test_an_actor_logs_losing_and_regaining_contact_with_a_peer(caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context.instance()
    port = free_port()
    server = transport.make_socket(ctx, zmq.ROUTER)
    server.bind(f"tcp://127.0.0.1:{port}")
    client = transport.make_socket(ctx, zmq.DEALER)
    log = logging.getLogger("rlmq.test-contact")
    contact = Contact(client, "the learner", log)
    client.connect(f"tcp://127.0.0.1:{port}")

    def until(state: bool) -> float:
        started = time.monotonic()
        while contact.check() != state:
            assert time.monotonic() - started < 10, f"contact never became {state}"
            time.sleep(0.02)
        return time.monotonic() - started

    try:
        with caplog.at_level(logging.INFO, "rlmq.test-contact"):
            until(True)
            assert not caplog.records  # the first contact is no news
            server.close()
            until(False)
            server = transport.make_socket(ctx, zmq.ROUTER)
            server.bind(f"tcp://127.0.0.1:{port}")
            assert until(True) < 2.0  # redialled every 0.1 s
        said = [r.getMessage() for r in caplog.records]
        assert said[0] == "lost contact with the learner; reconnecting"
        assert said[1].startswith("in contact with the learner again, after ") and len(said) == 2
    finally:
        contact.close()
        client.close()
        server.close()


def test_rlmq_keys_writes_each_process_its_own_bundle_and_a_wrong_one_is_one_error_line(tmp_path: Path) -> None:
    rlmq = [sys.executable, "-m", "rlmq.cli"]
    subprocess.run(
        [*rlmq, "keys", str(tmp_path / "keys"), "--learners", "2", "--actors", "3"], check=True, capture_output=True
    )
    bundles = tmp_path / "keys" / "bundles"
    expected = {
        "coordinator": key_files(None, True),
        **{f"learner-{r}": key_files(f"learner-{r}", True) for r in (0, 1)},
        **{f"actor-{i}": key_files(f"actor-{i}", False) for i in range(3)},
    }
    assert {p.name: sorted(f.name for f in p.iterdir()) for p in bundles.iterdir()} == {
        name: sorted(files) for name, files in expected.items()
    }
    assert all(
        (bundles / "actor-2" / f).read_bytes() == (tmp_path / "keys" / f).read_bytes()
        for f in key_files("actor-2", False)
    )
    assert {oct(p.stat().st_mode & 0o777) for p in bundles.rglob("*")} == {"0o700", "0o600"}
    wrong = subprocess.run(
        [*rlmq, "actor", "--name", "actor-1", "--keys", str(bundles / "actor-0")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.count("\n") == 1 and wrong.stderr.startswith("error: --keys ")
    assert "actor-1.key_secret is missing" in wrong.stderr and "bundles/actor-1/" in wrong.stderr


def test_a_learner_waiting_for_its_world_ends_on_sigterm_at_once(tmp_path: Path) -> None:
    """Rank 0 of a world of two whose rank 1 never comes: torch waits in C++ for minutes, where no
    Python signal handler runs; a SIGTERM ends it at once."""
    script = (
        "from rlmq.common.service import StopFlag, install_signal_handlers, signals_end_at_once\n"
        "import logging, sys\n"
        "from rlmq.learners import distributed\n"
        "install_signal_handlers(StopFlag(), logging.getLogger())\n"
        "with signals_end_at_once():\n"
        "    print('waiting', flush=True)\n"
        f"    distributed.init_world(0, 2, '127.0.0.1', {free_port()}, 'cpu', '127.0.0.1')\n"
    )
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert rank0.stdout is not None and rank0.stdout.readline() == "waiting\n"
        time.sleep(1.0)  # inside the rendezvous
        rank0.terminate()
        assert rank0.wait(5) == -15
    finally:
        rank0.kill()
