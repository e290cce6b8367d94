"""A run of separate services on this host, secured by a keys directory that holds a fleet key (as on
Kubernetes), and a flood of identities that ask learners for credit and never send a rollout:
what tests/test_credit_flood.py and benchmarks/bench_credit_flood.py share."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from rlmq.cli.redis_server import RedisServer
from rlmq.common import security, transport, wire
from rlmq.common.config import RunConfig
from rlmq.common.service import die_with_parent
from rlmq.common.transport import free_port
from rlmq.coordinator.records import RunStatus
from rlmq.coordinator.store import RunStore

RLMQ = [sys.executable, "-m", "rlmq.cli"]


class FleetRun:
    """A private Redis, the coordinator, one learner and `actors` actors (each with a key of its own),
    every socket on CURVE; the keys directory also holds the fleet's key. With `learner_metrics`, the
    learner serves its Prometheus metrics (`learner_metrics_target`)."""

    def __init__(
        self,
        root: Path,
        run_config: RunConfig,
        actors: int,
        run: str = "flood",
        start_actors: bool = True,
        learner_metrics: bool = False,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.keys = root, root / "keys"
        security.create_keys(self.keys, learners=1, actors=actors, fleet=True)
        self.redis = RedisServer(root / "redis", persist=False)
        self.store = RunStore.connect(self.redis.url, run)
        config_file = root / "run.json"
        config_file.write_text(json.dumps(dataclasses.asdict(run_config)))
        control, broadcast = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        self.control, self.experience = control, f"tcp://127.0.0.1:{free_port()}"
        self.processes: list[subprocess.Popen[bytes]] = []
        keys = ["--keys", str(self.keys)]
        self.start(
            "coordinator",
            "coordinator",
            "--run",
            run,
            "--redis-url",
            self.redis.url,
            "--run-config",
            str(config_file),
            "--metrics-port",
            "-1",
            "--control-bind",
            control,
            "--broadcast-bind",
            broadcast,
            *keys,
        )
        self.start(
            "learner",
            "learner",
            "--run",
            run,
            "--coordinator",
            control,
            "--broadcast",
            broadcast,
            "--rank",
            "0",
            "--world-size",
            "1",
            "--master-port",
            str(free_port()),
            *(("--metrics-port", "0", "--announce", str(root / "learner.ports")) if learner_metrics else ()),
            *(() if learner_metrics else ("--metrics-port", "-1")),
            "--experience-port",
            self.experience.rsplit(":", 1)[1],
            "--checkpoint-dir",
            str(root / "checkpoints"),
            *keys,
        )
        self.actors, self.broadcast = actors, broadcast
        if start_actors:
            self.start_actors()

    def start_actors(self) -> None:
        self.actors_started_at = time.time()
        for i in range(self.actors):
            self.start(
                f"actor-{i}",
                "actor",
                "--name",
                f"actor-{i}",
                "--coordinator",
                self.control,
                "--broadcast",
                self.broadcast,
                "--metrics-port",
                "-1",
                "--keys",
                str(self.keys),
            )

    def start(self, log_name: str, *args: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with open(self.root / f"{log_name}.log", "wb") as log:
            self.processes.append(
                subprocess.Popen(
                    [*RLMQ, *args], stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
                )
            )

    @property
    def learner_metrics_target(self) -> str:
        """The learner's metrics as HOST:PORT, once it has announced its port (`learner_metrics`)."""
        port = json.loads((self.root / "learner.ports").read_text())["metrics_port"]
        return f"127.0.0.1:{port}"

    def status(self) -> RunStatus:
        return self.store.status()

    def wait(self, predicate: Callable[[RunStatus], Any], timeout_s: float, what: str) -> RunStatus:
        """The status once `predicate(status)` holds; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if predicate(status):
                return status
            if any(p.poll() not in (None, 0) for p in self.processes):
                raise AssertionError(f"a service failed while waiting for {what}; logs in {self.root}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; logs in {self.root}")

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.redis.stop()


class Flood:
    """`identities` sockets holding the fleet's key, each a new actor name, renewing a request for
    credit every CREDIT_REQUEST_RENEW_S at the learner at `endpoint` and never sending a rollout."""

    def __init__(self, keys_dir: Path, endpoint: str, identities: int) -> None:
        self.keys = security.load_keys(keys_dir, security.FLEET, serves=False)
        self.endpoint, self.identities = endpoint, identities
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="flood", daemon=True)

    def __enter__(self) -> Flood:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)

    def run(self) -> None:
        ctx = zmq.Context()
        socks = []
        for _ in range(self.identities):
            sock = transport.make_socket(ctx, zmq.DEALER)
            security.connect_securely(sock, self.keys)
            sock.connect(self.endpoint)
            socks.append(sock)
        hellos = [
            wire.encode(wire.Hello(role="actor", name=f"flood-{i}", pid=1, member=0)) for i in range(self.identities)
        ]
        try:
            while not self.stopping.wait(wire.CREDIT_REQUEST_RENEW_S):
                for sock, hello in zip(socks, hellos, strict=True):
                    with contextlib.suppress(zmq.Again):  # not connected yet
                        sock.send(hello, zmq.NOBLOCK)
        finally:
            for sock in socks:
                sock.close(0)
            ctx.term()
