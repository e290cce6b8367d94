"""What `rlmq up` starts: each child's command line, and the listening sockets bound for it.

The ports every other process must be told of are bound here (the learner world's rendezvous when
the world starts, `Supervisor.start_learner_world`), and the listening sockets handed down to the
processes that serve them: no other socket can take one in between. Each child's metrics port is
planned here too, for Prometheus to be told where to scrape; a child that finds it taken binds
another and announces it (the supervisor follows the announcements).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rlmq.cli.upconfig import UpConfig
from rlmq.common.security import create_keys
from rlmq.common.service import cores_given
from rlmq.common.transport import free_port

COMMAND = [sys.executable, "-m", "rlmq.cli"]


@dataclass(frozen=True)
class Listener:
    """A listening socket `rlmq up` binds for a child and hands down to it: TCP at `port`, or Unix
    at `path`."""

    sock: socket.socket
    port: int = 0
    path: str = ""

    @property
    def fd(self) -> int:
        return self.sock.fileno()


@dataclass
class Child:
    name: str
    role: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    log_path: Path = field(default_factory=Path)
    metrics_port: int = 0
    # Handed down at every start, and kept open here meanwhile: a restarted child serves the same
    # port, and what connects while it is down waits in the listening socket's backlog.
    listeners: list[Listener] = field(default_factory=list)
    rank: int = -1  # a learner's


class Sockets:
    """The listening sockets bound for the children; Unix ones in a directory of this run's own
    under the system's temporary one (mode 0700; a run directory's path may pass the 107 bytes a
    socket's path may have), gone with `remove`."""

    def __init__(self) -> None:
        self.unix_dir: Path | None = None

    def tcp(self, host: str) -> Listener:
        sock = socket.create_server(("" if host == "*" else host, 0), backlog=128)
        return Listener(sock, port=int(sock.getsockname()[1]))

    def unix(self, name: str) -> Listener:
        if self.unix_dir is None:
            self.unix_dir = Path(tempfile.mkdtemp(prefix="rlmq-"))
        path = str(self.unix_dir / name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(128)
        return Listener(sock, path=path)

    def remove(self) -> None:
        if self.unix_dir is not None:
            shutil.rmtree(self.unix_dir, ignore_errors=True)


def announce_path(run_dir: Path, child: Child) -> Path:
    """Where `child` writes the metrics port it bound."""
    return run_dir / "ports" / f"{child.name}.json"


def plan(cfg: UpConfig, redis_address: str, redis_password_file: str, sockets: Sockets) -> tuple[list[Child], str]:
    """Every child, in the order they start (the coordinator, the learner ranks, the actors), and
    the host they reach each other at."""
    host = cfg.bind_host
    control, broadcast = sockets.tcp(host), sockets.tcp(host)
    reach = "127.0.0.1" if host == "*" else host
    endpoints = ["--coordinator", f"tcp://{reach}:{control.port}", "--broadcast", f"tcp://{reach}:{broadcast.port}"]
    children = [coordinator(cfg, redis_address, redis_password_file, control, broadcast)]
    for rank in range(cfg.learners):
        children.append(learner(cfg, rank, endpoints, reach, sockets))
    env_threads = str(max(1, cores_given() // cfg.actors))  # the cores shared out among the actors
    for index in range(cfg.actors):
        name = f"actor-{index}"
        argv = [*COMMAND, "actor", "--name", name, *endpoints, "--device", cfg.actor_device]
        children.append(Child(name, "actor", [*argv, "--env-threads", env_threads]))
    if cfg.secure:  # the keys' directory, never a key, on the command lines
        keys = cfg.run_dir / "keys"
        if not (keys / "server.key_secret").exists():  # a resumed run keeps its keys
            shutil.rmtree(keys, ignore_errors=True)
            create_keys(keys, cfg.learners, cfg.actors)
        for child in children:
            child.argv += ["--keys", str(keys)]
    (cfg.run_dir / "ports").mkdir(exist_ok=True)
    taken: set[int] = set()
    for child in children:
        child.metrics_port = metrics_port(host, taken)
        announce = str(announce_path(cfg.run_dir, child))
        child.argv += ["--metrics-port", str(child.metrics_port), "--bind-host", host, "--announce", announce]
    return children, reach


def coordinator(
    cfg: UpConfig, redis_address: str, redis_password_file: str, control: Listener, broadcast: Listener
) -> Child:
    host = cfg.bind_host
    argv = [
        *COMMAND,
        "coordinator",
        "--run",
        cfg.run,
        "--redis-url",
        redis_address,
        "--redis-password-file",
        redis_password_file,
        "--run-config",
        str(cfg.run_dir / "config.json"),
        "--control-bind",
        f"tcp://{host}:{control.port}",
        "--control-fd",
        str(control.fd),
        "--broadcast-bind",
        f"tcp://{host}:{broadcast.port}",
        "--broadcast-fd",
        str(broadcast.fd),
        "--tensorboard-dir",
        str(cfg.run_dir / "tb"),
    ]
    return Child("coordinator", "coordinator", argv, listeners=[control, broadcast])


def learner(cfg: UpConfig, rank: int, endpoints: list[str], reach: str, sockets: Sockets) -> Child:
    if cfg.transport == "ipc":
        experience = sockets.unix(f"learner-{rank}.sock")
        served = ["--experience-ipc", experience.path]
    else:
        experience = sockets.tcp(cfg.bind_host)
        served = ["--experience-port", str(experience.port)]
    argv = [
        *COMMAND,
        "learner",
        "--run",
        cfg.run,
        *endpoints,
        "--rank",
        str(rank),
        "--world-size",
        str(cfg.learners),
        "--master-addr",
        reach,
        "--advertise-host",
        reach,
        *served,
        "--experience-fd",
        str(experience.fd),
        "--torch-threads",
        str(cfg.torch_threads),
        "--device",
        cfg.device,
        "--collective-timeout",
        str(cfg.collective_timeout_s),
        "--checkpoint-dir",
        str(cfg.run_dir / "checkpoints"),
    ]
    return Child(f"learner-{rank}", "learner", argv, listeners=[experience], rank=rank)


def metrics_port(host: str, taken: set[int]) -> int:
    """A free port none of the other children was handed: two would fight over it all run long."""
    for _ in range(1000):
        drawn = free_port("0.0.0.0" if host == "*" else host)
        if drawn not in taken:
            taken.add(drawn)
            return drawn
    raise RuntimeError(f"no free port on {host}")
