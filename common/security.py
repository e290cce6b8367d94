"""CURVE for a run's ZeroMQ sockets: its keys, who may connect, and as whom.

A run's keys live in one directory (`rlmq keys DIR`), the directory mode 0700 and every file 0600,
in pyzmq's certificate format (`zmq.auth`), so its own tools read them too:

    server.key, server.key_secret      the key pair every server socket presents (the coordinator's
                                       control and broadcast, each learner's experience socket)
    <name>.key, <name>.key_secret      one pair per client: learner-<rank>, actor-<i>, and
                                       `actors`, the fleet's: one pair for actors of any name
                                       (a Kubernetes Deployment's pods, named at random)
    allowed.json                       each client's public key (Z85) → its role and name

A server socket asks its process's `Gatekeeper` (pyzmq's ZAP handler thread) about each client
that connects. A key on the allow-list is let in, and every message it sends carries the ZAP
User-Id "role:name" (`peer_of`), by which a service decides what that message may do. Any other
key never gets past the handshake, so no handler ever sees its messages: it is counted and logged
once per key. A peer that speaks no CURVE at all fails the handshake before ZAP is asked; the
server sockets' monitors count it (`Gatekeeper.watch`). What each role may say is `refusal`.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from rlmq.common import wire

log = logging.getLogger(__name__)

ROLES = ("learner", "actor")
SERVER = "server"
FLEET = "actors"  # the key file of the fleet's shared actor key
ANY_ACTOR = "*"  # the name the fleet's key speaks as: any actor's
ALLOWED_FILE = "allowed.json"
MAX_LOGGED_KEYS = 16  # refused keys logged one by one; past them, a count once a minute (a flood of keys)
REFUSED_SUMMARY_S = 60.0
# A peer without CURVE fails the handshake on the mechanism (ZMTP "mechanism mismatch"), or early.
PLAIN_PEER_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


@dataclass(frozen=True)
class Peer:
    """Who a client key belongs to: its role and its name (learner-<rank>, actor-<i>)."""

    role: str
    name: str

    @property
    def user_id(self) -> str:
        return f"{self.role}:{self.name}"

    @classmethod
    def parse(cls, user_id: str) -> Peer | None:
        role, _, name = user_id.partition(":")
        return cls(role, name) if role in ROLES and name else None

    def is_learner(self, rank: int) -> bool:
        return self.role == "learner" and self.name == f"learner-{rank}"

    def is_actor(self, name: str) -> bool:
        return self.role == "actor" and self.name in (name, ANY_ACTOR)


def check_sender(part: zmq.Frame, message: wire.Message) -> None:
    """On a secure run's server socket: `WireError` (reason "role") unless the key `part` came
    with may send `message`."""
    peer = peer_of(part)
    problem = refusal(peer, message) if peer is not None else "a message without a listed key's identity"
    if problem:
        raise wire.WireError("role", problem)


def refusal(peer: Peer | None, message: wire.Message) -> str:
    """Why `peer` may not send `message` ("": it may); what each role may say, and as whom. On a
    run without keys (`peer` None) anyone may say anything: that is the trusted network's place.
    A learner's key speaks for its rank alone, an actor's for its name alone (the fleet's for any
    actor), and only rank 0 publishes weights; nobody sends the coordinator's own messages
    (Assign, Decision, ...)."""
    if peer is None:
        return ""
    match message:
        case wire.Hello(role="learner", rank=rank) | wire.LearnerReport(rank=rank) | wire.LearnerHeartbeat(rank=rank):
            allowed = peer.is_learner(rank)
        case wire.Hello(role="actor", name=name) | wire.ActorReport(name=name):
            allowed = peer.is_actor(name)
        case wire.Rollout(actor=name):
            allowed = peer.is_actor(name)
        case wire.Weights():
            allowed = peer.is_learner(0)
        case _:
            allowed = False
    return (
        ""
        if allowed
        else f"{peer.user_id} may not send {type(message).__name__} "
        + (f"as {message.role} {message.name!r}" if isinstance(message, wire.Hello) else "")
    )


def clients(learners: int, actors: int, fleet: bool) -> dict[str, Peer]:
    """Key file name → the peer it speaks as."""
    named = [Peer("learner", f"learner-{r}") for r in range(learners)] + [
        Peer("actor", f"actor-{i}") for i in range(actors)
    ]
    return {peer.name: peer for peer in named} | ({FLEET: Peer("actor", ANY_ACTOR)} if fleet else {})


def create_keys(directory: Path, learners: int, actors: int, fleet: bool = False) -> None:
    """The server's key pair, one per client (and with `fleet` the actors' shared one) and the
    allow-list, readable by this user only (created so: the umask is 077 meanwhile, so no file is
    ever readable by others)."""
    umask = os.umask(0o077)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(stat.S_IRWXU)
        allowed = {}
        for name, peer in {SERVER: None, **clients(learners, actors, fleet)}.items():
            public_file, secret_file = zmq.auth.create_certificates(directory, name)
            for path in (public_file, secret_file):
                os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
            if peer is not None:
                public, _ = zmq.auth.load_certificate(public_file)
                allowed[public.decode("ascii")] = {"role": peer.role, "name": peer.name}
        (directory / ALLOWED_FILE).write_text(json.dumps(allowed, indent=1))
    finally:
        os.umask(umask)


@dataclass(frozen=True)
class Keys:
    """What one process holds: the servers' public key, its own pair (a client's), the servers'
    secret if it serves, and the allow-list if it serves."""

    server_public: bytes
    public: bytes | None
    secret: bytes | None
    server_secret: bytes | None
    allowed: dict[bytes, Peer]


def key_files(name: str | None, serves: bool) -> list[str]:
    """The files process `name` (None: a server only, the coordinator) reads from its keys
    directory: what `rlmq keys` bundles for it."""
    files = [f"{SERVER}.key_secret", ALLOWED_FILE] if serves else [f"{SERVER}.key"]
    return files + ([f"{name}.key_secret"] if name is not None else [])


def load_keys(directory: Path, name: str | None, serves: bool) -> Keys:
    """The keys process `name` (None: a server only, the coordinator) needs; OSError or ValueError
    naming the file for a missing or unreadable one."""
    for file in key_files(name, serves):
        if not (directory / file).is_file():
            raise FileNotFoundError(f"{directory / file} is missing")
    server_public, server_secret = zmq.auth.load_certificate(
        directory / f"{SERVER}.key_secret" if serves else directory / f"{SERVER}.key"
    )
    public = secret = None
    if name is not None:
        public, secret = zmq.auth.load_certificate(directory / f"{name}.key_secret")
        if secret is None:
            raise ValueError(f"{directory / (name + '.key_secret')} holds no secret key")
    allowed: dict[bytes, Peer] = {}
    if serves:
        for key, entry in json.loads((directory / ALLOWED_FILE).read_text()).items():
            peer = Peer.parse(f"{entry['role']}:{entry['name']}")
            if peer is None:
                raise ValueError(f"{directory / ALLOWED_FILE}: {entry!r} is not a role and a name")
            allowed[key.encode("ascii")] = peer
    return Keys(server_public, public, secret, server_secret if serves else None, allowed)


def serve_securely(sock: zmq.Socket, keys: Keys) -> None:
    """Before bind: present the servers' key pair and have ZAP admit each client."""
    assert keys.server_secret is not None, "this process holds no server key"
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = keys.server_public, keys.server_secret


def connect_securely(sock: zmq.Socket, keys: Keys) -> None:
    """Before connect: this client's own pair, and the servers' public key to check them by."""
    assert keys.public is not None and keys.secret is not None, "this process holds no client key"
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey, sock.curve_secretkey = keys.public, keys.secret


def peer_of(part: zmq.Frame) -> Peer | None:
    """Who sent `part` (a message part received with copy=False on a CURVE server socket); None without a
    User-Id the allow-list gave."""
    try:
        user_id = part.get("User-Id")
    except zmq.ZMQError:  # no metadata: not from a CURVE connection
        return None
    return Peer.parse(user_id) if isinstance(user_id, str) else None


class Gatekeeper(ThreadAuthenticator):
    """The process's ZAP handler: clients whose public key is on the allow-list get in, as their
    role and name; `refused(key, first)` is called for every other key (`first`: the first time
    for that key), and, for the sockets it `watch`es, for every peer that speaks no CURVE at all
    (key "": ZAP never hears of those; the sockets' monitors do)."""

    def __init__(self, ctx: zmq.Context, allowed: dict[bytes, Peer], refused: Callable[[str, bool], None]) -> None:
        super().__init__(ctx)
        self.allowed, self.refused = allowed, refused
        self.logged: set[bytes] = set()
        self.unlogged, self.summarized_at = 0, time.monotonic()  # refusals past MAX_LOGGED_KEYS, not yet logged
        self.monitors: list[zmq.Socket] = []
        self.watching = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="gatekeeper-monitors", daemon=True)

    def start(self) -> None:
        super().start()
        self.configure_curve_callback("*", credentials_provider=self)

    def watch(self, *socks: zmq.Socket) -> None:
        """Count the peers without CURVE that `socks` (all the process's server sockets, once)
        turn away."""
        assert not self.monitors, "watch a process's server sockets in one call"
        self.monitors = [sock.get_monitor_socket(PLAIN_PEER_EVENTS) for sock in socks]
        self.watching.set()
        self.watcher.start()

    def _watch(self) -> None:
        poller = zmq.Poller()
        for monitor in self.monitors:
            poller.register(monitor, zmq.POLLIN)
        first = True
        while self.watching.is_set():
            for monitor, _ in poller.poll(100):
                event = recv_monitor_message(monitor)
                if event["event"] & PLAIN_PEER_EVENTS:
                    self.refused("", first)
                    first = False
        for monitor in self.monitors:
            monitor.close(0)

    def stop(self) -> None:
        if self.watcher.is_alive():
            self.watching.clear()
            self.watcher.join(timeout=5)
        super().stop()

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP asks about a connecting client's key (Z85); runs in the handler's thread."""
        if key in self.allowed:
            return True
        first = key not in self.logged and len(self.logged) < MAX_LOGGED_KEYS
        if first:
            self.logged.add(key)
        elif key not in self.logged:
            self.unlogged += 1
            if time.monotonic() - self.summarized_at >= REFUSED_SUMMARY_S:
                log.warning(
                    "refused %d more connection(s) with keys not on this run's allow-list in the last "
                    "%g s (the first %d keys were logged one by one)",
                    self.unlogged,
                    REFUSED_SUMMARY_S,
                    MAX_LOGGED_KEYS,
                )
                self.unlogged, self.summarized_at = 0, time.monotonic()
        self.refused(key.decode("ascii", "replace"), first)
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.allowed[z85.encode(client_public_key)].user_id


@dataclass(frozen=True)
class Credentials:
    """What a service applies to its sockets: CURVE with `keys`, or nothing (None: a run without
    keys, plain ZeroMQ)."""

    keys: Keys | None = None

    @classmethod
    def load(cls, keys_dir: str, name: str | None, serves: bool) -> Credentials:
        return cls(load_keys(Path(keys_dir), name, serves) if keys_dir else None)

    def server(self, sock: zmq.Socket) -> None:
        if self.keys is not None:
            serve_securely(sock, self.keys)

    def client(self, sock: zmq.Socket) -> None:
        if self.keys is not None:
            connect_securely(sock, self.keys)

    def gatekeeper(self, ctx: zmq.Context, refused: Callable[[str, bool], None]) -> Gatekeeper | None:
        """The process's ZAP handler, started (before its server sockets bind; `watch` them too);
        None without keys."""
        if self.keys is None:
            return None
        gatekeeper = Gatekeeper(ctx, self.keys.allowed, refused)
        gatekeeper.start()
        return gatekeeper


def log_refusal(key: str, first: bool) -> None:
    """`Gatekeeper`'s default `refused`: a line for the first refusal of each key, and for the first
    peer without CURVE."""
    if first and key:
        log.warning("refused a client whose key is not on this run's allow-list: %s… (each key logged once)", key[:8])
    elif first:
        log.warning("refused a client that speaks no CURVE (this run's sockets need the run's keys; logged once)")


def counting_refusals(count: Callable[[], object]) -> Callable[[str, bool], None]:
    """A service's `refused`: `count()` each refusal (its rejected-messages metric, reason "auth"),
    and a log line for each key's first."""

    def refused(key: str, first: bool) -> None:
        count()
        log_refusal(key, first)

    return refused
