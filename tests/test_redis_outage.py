"""Redis outages are ridden out: the store retries through them without dropping a write, the
coordinator keeps answering, and `rlmq up` keeps supervising and always writes its results.

Every Redis here is a real redis-server with its AOF on. An outage is that server terminated and a
new one started on the same port and data directory; it is restarted from the test's own thread,
since a server dies with the thread that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
import zmq
from procs import start_up, wait_for, wait_until_stepping

from rlmq.cli.redis_server import RedisServer
from rlmq.cli.run_redis import LastSeen
from rlmq.common import wire
from rlmq.common.redis_urls import shown_url
from rlmq.common.transport import free_port
from rlmq.coordinator.records import ProgressSample, RunStatus
from rlmq.coordinator.store import RunStore


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server for this test alone, to take down and bring back."""
    with RedisServer(tmp_path / "redis", persist=True) as server:
        yield server


# --- the store -------------------------------------------------------------------------------


def test_a_write_issued_during_an_outage_lands_once_redis_is_back(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RunStore.connect(own_redis.url, "outage", outage_s=15)
    store.set_status(state="running", env_steps=0)
    own_redis.stop()
    replies: list[Any] = []

    def write() -> None:  # a pipeline and a transaction, both issued while Redis is down
        replies.append(store.add_actor_report("actor-0", 0, 7, [1.5]))
        store.append_progress(ProgressSample(time=1.0, env_steps=7))
        replies.append(time.monotonic())

    down_at = time.monotonic()
    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(2.5)
    assert writer.is_alive(), "the write waits for Redis instead of failing"
    own_redis.restart()
    writer.join(15)
    assert not writer.is_alive() and len(replies) == 2, "the write never finished"
    assert replies[0] == (7, 1, 7, [1.5], 0, 0) and replies[1] - down_at >= 2.5
    # what was written before the outage came back from the AOF; the report counted once
    assert store.status() == RunStatus(state="running", env_steps=7, episodes=1)
    assert store.progress() == [ProgressSample(time=1.0, env_steps=7)]
    said = [r.getMessage() for r in caplog.records if r.name == "rlmq.store"]
    assert len(said) == 2, said  # once when it starts, once when it ends: not once per retry
    assert said[0] == f"Redis unreachable at {own_redis.url}; retrying for up to 15 s"
    assert said[1].startswith(f"Redis at {own_redis.url} reachable again after ")


def test_an_outage_longer_than_the_budget_raises_and_later_calls_fail_at_once(
    own_redis: RedisServer,
) -> None:
    store = RunStore.connect(own_redis.url, "outage", outage_s=0.5)
    store.set_status(state="running")
    own_redis.stop()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        store.set_status(state="stopping")
    assert 0.5 <= time.monotonic() - started < 3
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):  # this outage has spent its budget: one try only
        store.status()
    assert time.monotonic() - started < 0.5
    own_redis.restart()
    assert store.status() == RunStatus(state="running"), "the store works again once Redis is back"


def test_messages_never_show_a_password() -> None:
    assert shown_url("redis://:s3cret@10.0.0.5:6379/0") == "redis://:***@10.0.0.5:6379/0"
    assert shown_url("redis://rlmq:s3cret@redis:6379/2") == "redis://rlmq:***@redis:6379/2"
    assert shown_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


# --- the coordinator -------------------------------------------------------------------------


def start_coordinator(start_service: Any, tmp_path: Path, url: str, run_id: str, outage_s: float) -> tuple[Any, str]:
    """The coordinator as its own process, and its control endpoint."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"num_learners": 1, "num_envs": 4, "rollout_length": 8}))
    control = free_port()
    service = start_service(
        "coordinator",
        "coordinator",
        "--run",
        run_id,
        "--redis-url",
        url,
        "--run-config",
        str(config),
        "--metrics-port",
        "-1",
        "--control-bind",
        f"tcp://127.0.0.1:{control}",
        "--broadcast-bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--redis-outage-s",
        str(outage_s),
    )
    return service, f"tcp://127.0.0.1:{control}"


def test_the_coordinator_rides_out_an_outage_and_answers_what_came_during_it(
    own_redis: RedisServer, start_service: Any, tmp_path: Path, run_id: str
) -> None:
    coordinator, control = start_coordinator(start_service, tmp_path, own_redis.url, run_id, outage_s=20)
    store = RunStore.connect(own_redis.url, run_id, outage_s=10, report=None)
    wait_for(lambda: store.status().updated_at, 60, "the coordinator's first status")
    own_redis.stop()
    down_at = time.time()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(control)
    hello = wire.Hello(role="learner", name="l0", pid=1, rank=0, experience_endpoint="tcp://127.0.0.1:9")
    sock.send(wire.encode(hello))  # registering means a Redis write: it waits for the outage to end
    time.sleep(3)
    assert coordinator.alive(), coordinator.log()
    own_redis.restart()
    assert sock.poll(20_000, zmq.POLLIN), "no Assign after the outage"
    assert isinstance(wire.decode(sock.recv_multipart()[-1]), wire.Assign)
    assert store.learners()[0].name == "l0"
    wait_for(lambda: (store.status().updated_at or 0) > down_at + 3, 10, "status written after the outage")
    assert coordinator.alive()
    log = coordinator.log()
    assert log.count("Redis unreachable at") == 1 and log.count("reachable again after") == 1, log
    sock.close()


def coordinator_at_work(
    start_service: Any, tmp_path: Path, own_redis: RedisServer, run_id: str, outage_s: float
) -> Any:
    """A coordinator service that has written its first status."""
    coordinator, _ = start_coordinator(start_service, tmp_path, own_redis.url, run_id, outage_s=outage_s)
    store = RunStore.connect(own_redis.url, run_id)
    wait_for(lambda: store.status().updated_at, 60, "the coordinator's first status")
    return coordinator


def test_the_coordinator_gives_up_after_its_budget_with_one_line(
    own_redis: RedisServer, start_service: Any, tmp_path: Path, run_id: str
) -> None:
    coordinator = coordinator_at_work(start_service, tmp_path, own_redis, run_id, outage_s=1)
    own_redis.stop()
    assert coordinator.process.wait(30) == 1
    log = coordinator.log()
    assert log.count("giving up: Redis at") == 1 and "Traceback" not in log, log


def test_a_stop_request_ends_the_coordinators_wait_for_redis(
    own_redis: RedisServer, start_service: Any, tmp_path: Path, run_id: str
) -> None:
    coordinator = coordinator_at_work(start_service, tmp_path, own_redis, run_id, outage_s=60)
    own_redis.stop()
    time.sleep(1.5)  # into the outage: its next tick waits for Redis
    coordinator.process.send_signal(signal.SIGTERM)
    assert coordinator.process.wait(10) == 1, "SIGTERM must not wait out the outage budget"
    log = coordinator.log()
    assert "stopped while Redis at" in log and "Traceback" not in log, log


# --- rlmq up ---------------------------------------------------------------------------------


def private_redis_pid(up: subprocess.Popen[str]) -> int:
    """The pid of the redis-server `rlmq up` started (a direct child of it, from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == up.pid and b"-server" in command:  # redis-server or valkey-server
            return int(entry.name)
    raise AssertionError("no private Redis server under rlmq up")


@pytest.mark.slow
def test_up_rides_out_a_redis_outage_and_writes_its_results(tmp_path: Path, own_redis: RedisServer) -> None:
    run_dir = tmp_path / "run"
    up = start_up(
        run_dir,
        "--redis-url",
        own_redis.url,
        "--actors",
        "2",
        "--learners",
        "1",
        "--env",
        "CartPole-v1",
        "--target-return",
        "475",
        "--seed",
        "1",
    )
    wait_until_stepping(run_dir, up)
    own_redis.stop()
    time.sleep(10)  # the outage
    own_redis.restart()
    output, _ = up.communicate(timeout=120)
    assert up.returncode == 0, output
    assert f"Redis at {own_redis.url} unreachable; still supervising" in output, output
    assert f"Redis at {own_redis.url} reachable again after" in output, output
    assert "Traceback" not in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success"] and not summary["redis_unreachable"], summary
    assert (run_dir / "checkpoint.pt").stat().st_size > 0
    assert len((run_dir / "metrics.csv").read_text().splitlines()) > 3
    assert "Redis unreachable at" in (run_dir / "logs" / "coordinator.log").read_text()


def test_up_reads_the_weights_at_every_look_until_it_holds_trained_ones(redis_url: str, run_id: str) -> None:
    store = RunStore.connect(redis_url, run_id)
    seen = LastSeen()

    def publish(version: int) -> None:
        weights = wire.Weights(member=0, version=version, params={"w": np.full(2, version, np.float32)})
        store.put_encoded_weights(0, wire.encode(weights))

    seen.read(store, population=1)  # nothing published yet
    assert seen.weights == {}
    publish(0)
    seen.read(store, population=1)
    assert seen.weights[0].version == 0
    publish(1)  # the first update: read at the next look, not WEIGHTS_EVERY looks later
    seen.read(store, population=1)
    assert seen.weights[0].version == 1 and seen.looks < LastSeen.WEIGHTS_EVERY
    publish(2)  # trained weights in hand: the next read waits for its turn
    seen.read(store, population=1)
    assert seen.weights[0].version == 1
    while seen.looks % LastSeen.WEIGHTS_EVERY:
        seen.read(store, population=1)
    seen.read(store, population=1)
    assert seen.weights[0].version == 2


@pytest.mark.slow
def test_up_with_redis_gone_for_good_writes_what_it_saw_and_fails_without_a_traceback(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    run_dir = tmp_path / "run"
    up = start_up(
        run_dir,
        "--redis-url",
        own_redis.url,
        "--actors",
        "2",
        "--learners",
        "1",
        "--total-steps",
        "100000000",
        "--redis-outage-s",
        "2",
    )
    wait_until_stepping(run_dir, up)
    time.sleep(4.5)  # the supervisor reads every 2 s: let it read the run at least twice
    own_redis.stop()
    output, _ = up.communicate(timeout=90)
    assert up.returncode == 1, output
    assert "Traceback" not in output, output
    assert "summary.json hold what rlmq up last read" in output, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["redis_unreachable"] and summary["outcome"].startswith("failed: the coordinator"), summary
    assert summary["env_steps"] > 0, "the last status read stands in for Redis"
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("time,env_steps") and len(rows) >= 2, rows
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)  # the weights last read
    assert checkpoint["params"] and checkpoint["version"] == summary["policy_version"] > 0  # trained ones
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    assert "giving up: Redis at" in coordinator_log and "Traceback" not in coordinator_log


@pytest.mark.slow
def test_up_restarts_its_private_redis_when_it_dies(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    up = start_up(
        run_dir, "--actors", "2", "--learners", "1", "--env", "CartPole-v1", "--target-return", "475", "--seed", "1"
    )
    wait_until_stepping(run_dir, up)
    assert (run_dir / "redis" / "appendonlydir").is_dir(), "the private Redis keeps an AOF"
    os.kill(private_redis_pid(up), signal.SIGKILL)
    output, _ = up.communicate(timeout=120)
    assert up.returncode == 0, output
    assert "the private Redis server exited with -9; restarting it (1)" in output, output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success"] and summary["env_steps"] > 0, summary
    assert (run_dir / "checkpoint.pt").stat().st_size > 0


def test_up_names_an_unreachable_redis_in_one_line(tmp_path: Path) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    up = start_up(tmp_path / "run", "--redis-url", closed)
    output, _ = up.communicate(timeout=60)
    assert up.returncode == 1, output
    assert output.strip().count("\n") == 0 and "Traceback" not in output, output
    assert f"cannot reach Redis at {closed}" in output and "drop --redis-url" in output, output
    status = subprocess.run(
        [sys.executable, "-m", "rlmq.cli", "status", "--redis-url", closed, "--run", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    assert f"cannot reach Redis at {closed}" in status.stderr
